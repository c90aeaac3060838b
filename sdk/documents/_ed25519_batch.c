/* Entry signature checks for sdk/documents/verifier.py: one call checks many
 * signatures with the GIL released once, so a verification thread does not
 * wait for the interpreter between checks while the caller's thread holds it.
 *
 * libsodium is not linked: the caller passes the address of
 * crypto_sign_verify_detached from the library PyNaCl already loaded (and
 * initialised). Each answer is one byte, written as soon as it is known:
 * 0 = not checked yet, 3 = being checked (claimed atomically, so the caller's
 * thread and the verification threads never check an entry twice), 1 =
 * libsodium accepted, 2 = refused or malformed (the caller asks the full rule,
 * signature_ok, again). Feed (below) is a growing batch whose verification
 * threads wait for entries without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

typedef int (*verify_detached_fn)(const unsigned char *sig, const unsigned char *m,
                                  unsigned long long mlen, const unsigned char *pk);

#define AUTHOR_SIZE 32
#define SIGNATURE_SIZE 64

typedef struct {
    const unsigned char *author;
    const unsigned char *encoded;
    const unsigned char *signature;
    Py_ssize_t author_len;
    Py_ssize_t encoded_len;
    Py_ssize_t signature_len;
} item_t;

static int
bytes_at(PyObject *list, Py_ssize_t i, const unsigned char **data, Py_ssize_t *len)
{
    PyObject *item = PyList_GET_ITEM(list, i);
    if (!PyBytes_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "expected a list of bytes");
        return -1;
    }
    *data = (const unsigned char *)PyBytes_AS_STRING(item);
    *len = PyBytes_GET_SIZE(item);
    return 0;
}

#define PENDING 0
#define ACCEPTED 1
#define REFUSED 2
#define CLAIMED 3

/* Claim entry `at` and write libsodium's answer for `it` (no GIL needed). Returns 1
 * if this call answered it, 0 if someone else holds or answered it. */
static int
claim_and_check(verify_detached_fn verify, unsigned char *at, const item_t *it)
{
    unsigned char expected = PENDING;
    if (!__atomic_compare_exchange_n(at, &expected, CLAIMED, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return 0;
    unsigned char answer = REFUSED;
    if (it->author_len == AUTHOR_SIZE && it->signature_len == SIGNATURE_SIZE) {
        /* The signed bytes are the encoding without its last 64 bytes
         * (Python's encoded[:-64]: empty when shorter). */
        Py_ssize_t mlen = it->encoded_len > SIGNATURE_SIZE ? it->encoded_len - SIGNATURE_SIZE : 0;
        if (verify(it->signature, it->encoded, (unsigned long long)mlen, it->author) == 0)
            answer = ACCEPTED;
    }
    __atomic_store_n(at, answer, __ATOMIC_RELEASE);
    return 1;
}

PyDoc_STRVAR(check_doc,
"check(address, authors, encoded, signatures, answers, first_chunk, chunk_step, chunk_size, stop)\n"
"--\n\n"
"Check the entries of chunks first_chunk, first_chunk + chunk_step, ... with the GIL\n"
"released. An entry is claimed first (answers[i] from 0 to 3, atomically) and skipped\n"
"if someone else holds it; its answer then goes to answers[i] (1 accepted, 2 refused).\n"
"Stops before the next entry once stop[0] is non-zero. Returns how many it answered.");

static PyObject *
check(PyObject *self, PyObject *args)
{
    unsigned long long address;
    PyObject *authors, *encoded, *signatures;
    Py_buffer answers, stop;
    Py_ssize_t first_chunk, chunk_step, chunk_size;
    if (!PyArg_ParseTuple(args, "KO!O!O!w*nnnw*", &address, &PyList_Type, &authors,
                          &PyList_Type, &encoded, &PyList_Type, &signatures, &answers,
                          &first_chunk, &chunk_step, &chunk_size, &stop))
        return NULL;
    PyObject *result = NULL;
    item_t *items = NULL;
    Py_ssize_t *indices = NULL;
    Py_ssize_t n = PyList_GET_SIZE(authors);
    if (address == 0 || PyList_GET_SIZE(encoded) != n || PyList_GET_SIZE(signatures) != n ||
        answers.len < n || stop.len < 1 || first_chunk < 0 || chunk_step < 1 ||
        chunk_size < 1) {
        PyErr_SetString(PyExc_ValueError, "inconsistent arguments");
        goto done;
    }
    /* Gather the selected entries' buffers while holding the GIL. The lists and
     * their bytes objects are kept alive by the caller and bytes never move, so
     * the pointers stay valid once it is released. */
    Py_ssize_t selected = 0;
    for (Py_ssize_t start = first_chunk * chunk_size; start < n;
         start += chunk_step * chunk_size)
        selected += start + chunk_size < n ? chunk_size : n - start;
    items = PyMem_Malloc(sizeof(item_t) * (size_t)(selected > 0 ? selected : 1));
    indices = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(selected > 0 ? selected : 1));
    if (items == NULL || indices == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t start = first_chunk * chunk_size; start < n;
         start += chunk_step * chunk_size) {
        Py_ssize_t end = start + chunk_size < n ? start + chunk_size : n;
        for (Py_ssize_t i = start; i < end; i++, k++) {
            indices[k] = i;
            if (bytes_at(authors, i, &items[k].author, &items[k].author_len) < 0 ||
                bytes_at(encoded, i, &items[k].encoded, &items[k].encoded_len) < 0 ||
                bytes_at(signatures, i, &items[k].signature, &items[k].signature_len) < 0)
                goto done;
        }
    }
    verify_detached_fn verify = (verify_detached_fn)(uintptr_t)address;
    unsigned char *out = answers.buf;
    unsigned char *stopped = stop.buf;
    Py_ssize_t written = 0;
    Py_BEGIN_ALLOW_THREADS
    for (k = 0; k < selected; k++) {
        if (__atomic_load_n(stopped, __ATOMIC_RELAXED))
            break;
        written += claim_and_check(verify, &out[indices[k]], &items[k]);
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(written);
done:
    PyMem_Free(items);
    PyMem_Free(indices);
    PyBuffer_Release(&answers);
    PyBuffer_Release(&stop);
    return result;
}

/* settle()'s arguments (answers, index): the answer's byte, with `answers` to
 * release; NULL with an exception set (and nothing to release) if they are wrong. */
static unsigned char *
answer_at(PyObject *args, Py_buffer *answers)
{
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "w*n", answers, &index))
        return NULL;
    if (index < 0 || index >= answers->len) {
        PyBuffer_Release(answers);
        PyErr_SetString(PyExc_IndexError, "answer index out of range");
        return NULL;
    }
    return (unsigned char *)answers->buf + index;
}

PyDoc_STRVAR(settle_doc,
"settle(answers, index)\n"
"--\n\n"
"answers[index] once it is no longer 3 (claimed: another thread is checking it),\n"
"waited for with the GIL released.");

static PyObject *
settle(PyObject *self, PyObject *args)
{
    Py_buffer answers;
    unsigned char *at = answer_at(args, &answers);
    if (at == NULL)
        return NULL;
    unsigned char answer = __atomic_load_n(at, __ATOMIC_ACQUIRE);
    if (answer == CLAIMED) {
        /* A claimer always writes its answer within one check (tens of us). */
        Py_BEGIN_ALLOW_THREADS
        while ((answer = __atomic_load_n(at, __ATOMIC_ACQUIRE)) == CLAIMED)
            sched_yield();
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&answers);
    return PyLong_FromLong(answer);
}


/* A growing batch (Feed): entries are added under the GIL, each published by one
 * atomic count; verification threads take them in order (a shared cursor) and
 * wait for more on a condition variable, all with the GIL released, so a thread
 * never needs the interpreter between the batch's first entry and its end. An
 * entry's buffers are read from the bytes objects the feed holds references to,
 * in arrays of fixed capacity written before the count that publishes them. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    item_t *items;
    PyObject **held; /* 3 per entry added, released at dealloc */
    Py_ssize_t count;  /* entries published (atomic) */
    Py_ssize_t cursor; /* next entry a runner takes (atomic) */
    int sealed;        /* no more entries will come (atomic, set under mutex) */
    int stopped;       /* cancelled: runners return (atomic, set under mutex) */
    int waiters;       /* runners waiting on cond (atomic) */
    int settlers;      /* callers waiting on answered for a claimed entry (atomic) */
    int sync_ready;
    pthread_mutex_t mutex;
    pthread_cond_t cond;     /* runners: an entry was added, or sealed, or stopped */
    pthread_cond_t answered; /* settle(): a runner wrote an answer */
} FeedObject;

/* `seconds` (at most 1e6) from now, on the clock the feed's condition variables
 * measure their waits with. */
static void
feed_deadline(struct timespec *deadline, double seconds)
{
#if defined(CLOCK_MONOTONIC) && !defined(__APPLE__)
    clock_gettime(CLOCK_MONOTONIC, deadline);
#else
    clock_gettime(CLOCK_REALTIME, deadline);
#endif
    double whole = seconds > 1e6 ? 1e6 : seconds;
    deadline->tv_sec += (time_t)whole;
    deadline->tv_nsec += (long)((whole - (double)(time_t)whole) * 1e9);
    if (deadline->tv_nsec >= 1000000000L) {
        deadline->tv_sec += 1;
        deadline->tv_nsec -= 1000000000L;
    }
}

static PyObject *
feed_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t capacity;
    static char *kwlist[] = {"capacity", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &capacity))
        return NULL;
    if (capacity < 1 || capacity > PY_SSIZE_T_MAX / (Py_ssize_t)(3 * sizeof(PyObject *))) {
        PyErr_SetString(PyExc_ValueError, "a feed holds at least one entry");
        return NULL;
    }
    FeedObject *self = (FeedObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->capacity = capacity;
    self->items = PyMem_Calloc((size_t)capacity, sizeof(item_t));
    self->held = PyMem_Calloc((size_t)capacity * 3, sizeof(PyObject *));
    if (self->items == NULL || self->held == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
#if defined(CLOCK_MONOTONIC) && !defined(__APPLE__)
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#endif
    int failed = pthread_mutex_init(&self->mutex, NULL) != 0;
    if (!failed && pthread_cond_init(&self->cond, &attr) != 0) {
        pthread_mutex_destroy(&self->mutex);
        failed = 1;
    }
    if (!failed && pthread_cond_init(&self->answered, &attr) != 0) {
        pthread_cond_destroy(&self->cond);
        pthread_mutex_destroy(&self->mutex);
        failed = 1;
    }
    pthread_condattr_destroy(&attr);
    if (failed) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->sync_ready = 1;
    return (PyObject *)self;
}

static void
feed_dealloc(FeedObject *self)
{
    /* No runner is inside run(): each call holds a reference to the feed. */
    if (self->held != NULL) {
        for (Py_ssize_t i = 0; i < self->count * 3; i++)
            Py_XDECREF(self->held[i]);
        PyMem_Free(self->held);
    }
    PyMem_Free(self->items);
    if (self->sync_ready) {
        pthread_cond_destroy(&self->answered);
        pthread_cond_destroy(&self->cond);
        pthread_mutex_destroy(&self->mutex);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Set a flag under the mutex and wake every runner. The GIL is kept: a runner
 * holds the mutex only between a check of the feed and its wait, never waiting
 * for the GIL meanwhile. */
static void
feed_raise_flag(FeedObject *self, int *flag)
{
    pthread_mutex_lock(&self->mutex);
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&self->cond);
    pthread_mutex_unlock(&self->mutex);
}

PyDoc_STRVAR(feed_add_doc,
"add(author, encoded, signature)\n"
"--\n\n"
"Append an entry (three bytes objects; the signature covers encoded[:-64]) and wake a\n"
"runner waiting for it. Returns its index.");

static PyObject *
feed_add(FeedObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "add(author, encoded, signature)");
        return NULL;
    }
    for (int j = 0; j < 3; j++)
        if (!PyBytes_Check(args[j])) {
            PyErr_SetString(PyExc_TypeError, "an entry's author, encoded and signature are bytes");
            return NULL;
        }
    Py_ssize_t n = self->count; /* only ever written here, under the GIL */
    if (n >= self->capacity) {
        PyErr_Format(PyExc_ValueError, "the feed holds %zd entries at most", self->capacity);
        return NULL;
    }
    item_t *it = &self->items[n];
    it->author = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    it->author_len = PyBytes_GET_SIZE(args[0]);
    it->encoded = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    it->encoded_len = PyBytes_GET_SIZE(args[1]);
    it->signature = (const unsigned char *)PyBytes_AS_STRING(args[2]);
    it->signature_len = PyBytes_GET_SIZE(args[2]);
    for (int j = 0; j < 3; j++) {
        Py_INCREF(args[j]);
        self->held[3 * n + j] = args[j];
    }
    /* Publish, then look for a waiter: a runner registers as waiter before it
     * looks at the count again, so one of the two sees the other (both seq_cst). */
    __atomic_store_n(&self->count, n + 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&self->waiters, __ATOMIC_SEQ_CST)) {
        /* The mutex is only held by a runner between its check and its wait. */
        pthread_mutex_lock(&self->mutex);
        pthread_cond_signal(&self->cond);
        pthread_mutex_unlock(&self->mutex);
    }
    return PyLong_FromSsize_t(n);
}

PyDoc_STRVAR(feed_seal_doc,
"seal()\n"
"--\n\n"
"No more entries will come: runners return once every entry is taken.");

static PyObject *
feed_seal(FeedObject *self, PyObject *Py_UNUSED(ignored))
{
    feed_raise_flag(self, &self->sealed);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(feed_stop_doc,
"stop()\n"
"--\n\n"
"Cancel: runners return before their next entry (entries not taken stay 0).");

static PyObject *
feed_stop(FeedObject *self, PyObject *Py_UNUSED(ignored))
{
    feed_raise_flag(self, &self->stopped);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(feed_run_doc,
"run(address, answers, idle)\n"
"--\n\n"
"Check the feed's entries in order with the GIL released, as a verification thread:\n"
"take the next entry not taken by another runner, claim its answer (answers[i] from 0\n"
"to 3, skipped if someone else holds it) and write it (1 accepted, 2 refused); with\n"
"none left, wait for add(), seal() or stop(). Returns how many it answered, once the\n"
"feed is sealed and every entry taken, once it is stopped, or once no entry came\n"
"for idle seconds (an abandoned batch: whoever asks checks the rest).");

static PyObject *
feed_run(FeedObject *self, PyObject *args)
{
    unsigned long long address;
    Py_buffer answers;
    double idle;
    if (!PyArg_ParseTuple(args, "Kw*d", &address, &answers, &idle))
        return NULL;
    if (address == 0 || answers.len < self->capacity || !(idle >= 0)) {
        PyBuffer_Release(&answers);
        PyErr_SetString(PyExc_ValueError, "inconsistent arguments");
        return NULL;
    }
    verify_detached_fn verify = (verify_detached_fn)(uintptr_t)address;
    unsigned char *out = answers.buf;
    Py_ssize_t written = 0;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        if (__atomic_load_n(&self->stopped, __ATOMIC_SEQ_CST))
            break;
        Py_ssize_t c = __atomic_load_n(&self->cursor, __ATOMIC_SEQ_CST);
        if (c < __atomic_load_n(&self->count, __ATOMIC_SEQ_CST)) {
            if (__atomic_compare_exchange_n(&self->cursor, &c, c + 1, 0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST) &&
                claim_and_check(verify, &out[c], &self->items[c])) {
                written++;
                /* The answer is out; a settler registers before it looks at it
                 * again, so one of the two sees the other. */
                __atomic_thread_fence(__ATOMIC_SEQ_CST);
                if (__atomic_load_n(&self->settlers, __ATOMIC_SEQ_CST)) {
                    pthread_mutex_lock(&self->mutex);
                    pthread_cond_broadcast(&self->answered);
                    pthread_mutex_unlock(&self->mutex);
                }
            }
            continue;
        }
        /* Nothing to take: done if sealed (the count before the seal is final). */
        if (__atomic_load_n(&self->sealed, __ATOMIC_SEQ_CST)) {
            if (__atomic_load_n(&self->count, __ATOMIC_SEQ_CST) <= c)
                break;
            continue;
        }
        struct timespec deadline;
        feed_deadline(&deadline, idle);
        int timed_out = 0;
        pthread_mutex_lock(&self->mutex);
        __atomic_add_fetch(&self->waiters, 1, __ATOMIC_SEQ_CST);
        while (!__atomic_load_n(&self->stopped, __ATOMIC_SEQ_CST) &&
               !__atomic_load_n(&self->sealed, __ATOMIC_SEQ_CST) &&
               __atomic_load_n(&self->count, __ATOMIC_SEQ_CST) <=
                   __atomic_load_n(&self->cursor, __ATOMIC_SEQ_CST)) {
            if (pthread_cond_timedwait(&self->cond, &self->mutex, &deadline) == ETIMEDOUT) {
                timed_out = 1;
                break;
            }
        }
        __atomic_sub_fetch(&self->waiters, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&self->mutex);
        if (timed_out && __atomic_load_n(&self->count, __ATOMIC_SEQ_CST) <=
                             __atomic_load_n(&self->cursor, __ATOMIC_SEQ_CST))
            break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&answers);
    return PyLong_FromSsize_t(written);
}

PyDoc_STRVAR(feed_settle_doc,
"settle(answers, index)\n"
"--\n\n"
"answers[index] once it is no longer 3 (claimed: a runner of this feed is checking it),\n"
"waited for with the GIL released, asleep until that runner writes it.");

static PyObject *
feed_settle(FeedObject *self, PyObject *args)
{
    Py_buffer answers;
    unsigned char *at = answer_at(args, &answers);
    if (at == NULL)
        return NULL;
    unsigned char answer = __atomic_load_n(at, __ATOMIC_SEQ_CST);
    if (answer == CLAIMED) {
        /* A runner of this feed wakes us once it wrote an answer; the claimer
         * may also be another thread checking through check() (which wakes no
         * one), so the answer is looked at again every few milliseconds too. */
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mutex);
        __atomic_add_fetch(&self->settlers, 1, __ATOMIC_SEQ_CST);
        while ((answer = __atomic_load_n(at, __ATOMIC_SEQ_CST)) == CLAIMED) {
            struct timespec deadline;
            feed_deadline(&deadline, 0.002);
            pthread_cond_timedwait(&self->answered, &self->mutex, &deadline);
        }
        __atomic_sub_fetch(&self->settlers, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&self->mutex);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&answers);
    return PyLong_FromLong(answer);
}

static PyObject *
feed_get_waiting(FeedObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLong(__atomic_load_n(&self->waiters, __ATOMIC_SEQ_CST));
}

static PyObject *
feed_get_taken(FeedObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(__atomic_load_n(&self->cursor, __ATOMIC_SEQ_CST));
}

static PyObject *
feed_len(FeedObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->count);
}

static PyMethodDef feed_methods[] = {
    {"add", (PyCFunction)(void (*)(void))feed_add, METH_FASTCALL, feed_add_doc},
    {"seal", (PyCFunction)feed_seal, METH_NOARGS, feed_seal_doc},
    {"stop", (PyCFunction)feed_stop, METH_NOARGS, feed_stop_doc},
    {"run", (PyCFunction)feed_run, METH_VARARGS, feed_run_doc},
    {"settle", (PyCFunction)feed_settle, METH_VARARGS, feed_settle_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef feed_getset[] = {
    {"waiting", (getter)feed_get_waiting, NULL, "Runners waiting for an entry now.", NULL},
    {"taken", (getter)feed_get_taken, NULL, "Entries runners have taken so far.", NULL},
    {"count", (getter)feed_len, NULL, "Entries added so far.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(feed_doc,
"Feed(capacity)\n"
"--\n\n"
"A growing batch of up to capacity entries that verification threads check as they\n"
"are added, waiting for more without the GIL (see sdk/documents/verifier.py).");

static PyTypeObject FeedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sdk.documents._ed25519_batch.Feed",
    .tp_basicsize = sizeof(FeedObject),
    .tp_dealloc = (destructor)feed_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = feed_doc,
    .tp_methods = feed_methods,
    .tp_getset = feed_getset,
    .tp_new = feed_new,
};

/* Sealed envelopes of sdk/encryption (docs/encryption.md): sealing one, and opening
 * and verifying a batch with the GIL released once. As for check(), libsodium is
 * not linked: the caller passes the addresses of the functions PyNaCl's library
 * exports. The envelope is version (1) | epoch (u32) | timestamp (u64) | nonce (24)
 * | XChaCha20-Poly1305 of (u16 signer | ed25519 signature (64) | sds), its associated
 * data ad_prefix | header, its signature over sig_prefix | header | sds. */
typedef int (*sign_detached_fn)(unsigned char *sig, unsigned long long *siglen,
                                const unsigned char *m, unsigned long long mlen,
                                const unsigned char *sk);
typedef void (*random_fn)(void *buf, size_t size);
typedef int (*aead_encrypt_fn)(unsigned char *c, unsigned long long *clen,
                               const unsigned char *m, unsigned long long mlen,
                               const unsigned char *ad, unsigned long long adlen,
                               const unsigned char *nsec, const unsigned char *npub,
                               const unsigned char *k);
typedef int (*aead_decrypt_fn)(unsigned char *m, unsigned long long *mlen,
                               unsigned char *nsec, const unsigned char *c,
                               unsigned long long clen, const unsigned char *ad,
                               unsigned long long adlen, const unsigned char *npub,
                               const unsigned char *k);

#define ENVELOPE_VERSION 1
#define HEADER_SIZE 37 /* version, epoch, timestamp, nonce */
#define NONCE_OFFSET 13
#define NONCE_SIZE 24
#define TAG_SIZE 16
#define KEY_SIZE 32
#define SIGNER_SIZE 2
#define SEAL_HEAD (SIGNER_SIZE + SIGNATURE_SIZE)

/* open_sealed()'s answer per envelope (sdk/encryption/channel.py maps them to errors). */
#define OPENED_ACCEPTED 1
#define OPENED_FORGED 2         /* the signature is not the signer's */
#define OPENED_AUTHENTICATION 4 /* the seal does not open under the key */
#define OPENED_NO_ROOM 5        /* no room for a signer and signature inside */
#define OPENED_UNKNOWN_SIGNER 6 /* the signer index is past the roster */

PyDoc_STRVAR(seal_doc,
"seal(sign, encrypt, random, secret_key, sig_prefix, ad_prefix, epoch, timestamp, signer, key, sds)\n"
"--\n\n"
"The envelope of sds: a fresh nonce (random, libsodium's randombytes_buf), the\n"
"ed25519 signature (sign: crypto_sign_detached, secret_key libsodium's 64 bytes) of\n"
"sig_prefix | header | sds, and the XChaCha20-Poly1305 seal (encrypt) of\n"
"u16 signer | signature | sds under key (32 bytes), with ad_prefix | header as\n"
"associated data. The three functions are libsodium's, by address.");

static PyObject *
seal_envelope(PyObject *self, PyObject *args)
{
    unsigned long long sign_addr, encrypt_addr, random_addr, timestamp;
    const unsigned char *secret, *sig_prefix, *ad_prefix, *key, *sds;
    Py_ssize_t secret_len, sig_prefix_len, ad_prefix_len, key_len, sds_len;
    unsigned int epoch, signer;
    if (!PyArg_ParseTuple(args, "KKKy#y#y#IKIy#y#", &sign_addr, &encrypt_addr, &random_addr,
                          &secret, &secret_len, &sig_prefix, &sig_prefix_len, &ad_prefix,
                          &ad_prefix_len, &epoch, &timestamp, &signer, &key, &key_len, &sds,
                          &sds_len))
        return NULL;
    if (sign_addr == 0 || encrypt_addr == 0 || random_addr == 0 || secret_len != 64 ||
        key_len != KEY_SIZE || signer > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "inconsistent arguments");
        return NULL;
    }
    size_t inner_len = SEAL_HEAD + (size_t)sds_len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + (Py_ssize_t)inner_len + TAG_SIZE);
    if (out == NULL)
        return NULL;
    unsigned char *header = (unsigned char *)PyBytes_AS_STRING(out);
    size_t signed_len = (size_t)sig_prefix_len + HEADER_SIZE + (size_t)sds_len;
    size_t ad_len = (size_t)ad_prefix_len + HEADER_SIZE;
    /* One scratch area: the signed bytes, then the AEAD's plaintext, then its ad. */
    unsigned char *scratch = PyMem_Malloc(signed_len + inner_len + ad_len);
    if (scratch == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    unsigned char *signed_at = scratch, *inner = scratch + signed_len, *ad = inner + inner_len;
    header[0] = ENVELOPE_VERSION;
    for (int i = 0; i < 4; i++)
        header[1 + i] = (unsigned char)(epoch >> (24 - 8 * i));
    for (int i = 0; i < 8; i++)
        header[5 + i] = (unsigned char)(timestamp >> (56 - 8 * i));
    ((random_fn)(uintptr_t)random_addr)(header + NONCE_OFFSET, NONCE_SIZE);
    memcpy(signed_at, sig_prefix, (size_t)sig_prefix_len);
    memcpy(signed_at + sig_prefix_len, header, HEADER_SIZE);
    memcpy(signed_at + sig_prefix_len + HEADER_SIZE, sds, (size_t)sds_len);
    inner[0] = (unsigned char)(signer >> 8);
    inner[1] = (unsigned char)signer;
    memcpy(inner + SEAL_HEAD, sds, (size_t)sds_len);
    memcpy(ad, ad_prefix, (size_t)ad_prefix_len);
    memcpy(ad + ad_prefix_len, header, HEADER_SIZE);
    /* The GIL is kept: the caller (the event loop) waits for the envelope anyway, and
     * taking it back after tens of microseconds could cost it a switch interval. */
    int failed = ((sign_detached_fn)(uintptr_t)sign_addr)(inner + SIGNER_SIZE, NULL, signed_at,
                                                          signed_len, secret) != 0;
    if (!failed)
        failed = ((aead_encrypt_fn)(uintptr_t)encrypt_addr)(
                     header + HEADER_SIZE, NULL, inner, inner_len, ad, ad_len, NULL,
                     header + NONCE_OFFSET, key) != 0;
    PyMem_Free(scratch);
    if (failed) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "libsodium failed to seal");
        return NULL;
    }
    return out;
}

typedef struct {
    const unsigned char *envelope, *key, *roster;
    Py_ssize_t envelope_len, roster_len;
    unsigned char *head, *sds; /* the bytes objects' buffers, filled without the GIL */
    Py_ssize_t sds_len;
    unsigned char answer;
} sealed_t;

/* Open and verify one envelope (no GIL needed): its answer, head and sds filled. */
static void
open_one(aead_decrypt_fn decrypt, verify_detached_fn verify, const unsigned char *sig_prefix,
         Py_ssize_t sig_prefix_len, const unsigned char *ad_prefix, Py_ssize_t ad_prefix_len,
         unsigned char *inner, unsigned char *signed_at, unsigned char *ad, sealed_t *it)
{
    const unsigned char *header = it->envelope;
    Py_ssize_t inner_len = it->envelope_len - HEADER_SIZE - TAG_SIZE;
    it->answer = OPENED_AUTHENTICATION;
    if (inner_len < 0)
        return;
    memcpy(ad, ad_prefix, (size_t)ad_prefix_len);
    memcpy(ad + ad_prefix_len, header, HEADER_SIZE);
    if (decrypt(inner, NULL, NULL, header + HEADER_SIZE,
                (unsigned long long)(it->envelope_len - HEADER_SIZE), ad,
                (unsigned long long)(ad_prefix_len + HEADER_SIZE), header + NONCE_OFFSET,
                it->key) != 0)
        return;
    if (inner_len < SEAL_HEAD) {
        it->answer = OPENED_NO_ROOM;
        return;
    }
    memcpy(it->head, inner, SEAL_HEAD);
    memcpy(it->sds, inner + SEAL_HEAD, (size_t)it->sds_len);
    Py_ssize_t signer = ((Py_ssize_t)inner[0] << 8) | inner[1];
    if (signer >= it->roster_len / AUTHOR_SIZE) {
        it->answer = OPENED_UNKNOWN_SIGNER;
        return;
    }
    Py_ssize_t signed_len = sig_prefix_len + HEADER_SIZE + it->sds_len;
    memcpy(signed_at, sig_prefix, (size_t)sig_prefix_len);
    memcpy(signed_at + sig_prefix_len, header, HEADER_SIZE);
    memcpy(signed_at + sig_prefix_len + HEADER_SIZE, it->sds, (size_t)it->sds_len);
    it->answer = verify(inner + SIGNER_SIZE, signed_at, (unsigned long long)signed_len,
                        it->roster + signer * AUTHOR_SIZE) == 0
                     ? OPENED_ACCEPTED
                     : OPENED_FORGED;
}

PyDoc_STRVAR(open_sealed_doc,
"open_sealed(decrypt, verify, sig_prefix, ad_prefix, envelopes, keys, rosters)\n"
"--\n\n"
"Open every envelope (decrypt: crypto_aead_xchacha20poly1305_ietf_decrypt, by address)\n"
"under keys[i] and verify its signature (verify: crypto_sign_verify_detached) by the\n"
"signer it names in rosters[i] (the epoch's public keys, 32 bytes each, in signer\n"
"order), all with the GIL released once. Returns one (answer, head, sds) per envelope:\n"
"answer 1 accepted, 2 forged signature, 4 the seal does not open, 5 no room for a\n"
"signer and signature, 6 signer not in the roster; head the u16 signer and signature\n"
"sealed inside (66 bytes) and sds the message, once the seal opened with room for them\n"
"(else None).");

static PyObject *
open_sealed(PyObject *self, PyObject *args)
{
    unsigned long long decrypt_addr, verify_addr;
    const unsigned char *sig_prefix, *ad_prefix;
    Py_ssize_t sig_prefix_len, ad_prefix_len;
    PyObject *envelopes, *keys, *rosters;
    if (!PyArg_ParseTuple(args, "KKy#y#O!O!O!", &decrypt_addr, &verify_addr, &sig_prefix,
                          &sig_prefix_len, &ad_prefix, &ad_prefix_len, &PyList_Type, &envelopes,
                          &PyList_Type, &keys, &PyList_Type, &rosters))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(envelopes);
    if (decrypt_addr == 0 || verify_addr == 0 || PyList_GET_SIZE(keys) != n ||
        PyList_GET_SIZE(rosters) != n) {
        PyErr_SetString(PyExc_ValueError, "inconsistent arguments");
        return NULL;
    }
    PyObject *result = NULL, *heads = NULL, *bodies = NULL;
    unsigned char *scratch = NULL;
    sealed_t *items = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(sealed_t));
    heads = PyList_New(n);
    bodies = PyList_New(n);
    if (items == NULL || heads == NULL || bodies == NULL) {
        if (items == NULL)
            PyErr_NoMemory();
        goto done;
    }
    /* Gather the buffers and make the output objects while holding the GIL; they are
     * filled without it (nobody else holds a reference to them until this returns). */
    Py_ssize_t longest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        sealed_t *it = &items[i];
        Py_ssize_t key_len;
        if (bytes_at(envelopes, i, &it->envelope, &it->envelope_len) < 0 ||
            bytes_at(keys, i, &it->key, &key_len) < 0 ||
            bytes_at(rosters, i, &it->roster, &it->roster_len) < 0)
            goto done;
        if (key_len != KEY_SIZE) {
            PyErr_SetString(PyExc_ValueError, "a key is 32 bytes");
            goto done;
        }
        Py_ssize_t inner_len = it->envelope_len - HEADER_SIZE - TAG_SIZE;
        PyObject *head = Py_None, *body = Py_None;
        if (inner_len >= SEAL_HEAD) {
            it->sds_len = inner_len - SEAL_HEAD;
            head = PyBytes_FromStringAndSize(NULL, SEAL_HEAD);
            body = head == NULL ? NULL : PyBytes_FromStringAndSize(NULL, it->sds_len);
            if (body == NULL) {
                Py_XDECREF(head);
                goto done;
            }
            it->head = (unsigned char *)PyBytes_AS_STRING(head);
            it->sds = (unsigned char *)PyBytes_AS_STRING(body);
        } else {
            Py_INCREF(Py_None);
            Py_INCREF(Py_None);
        }
        PyList_SET_ITEM(heads, i, head);
        PyList_SET_ITEM(bodies, i, body);
        if (inner_len > longest)
            longest = inner_len;
    }
    size_t ad_size = (size_t)ad_prefix_len + HEADER_SIZE;
    size_t signed_size = (size_t)sig_prefix_len + HEADER_SIZE + (size_t)longest;
    scratch = PyMem_Malloc((size_t)longest + 1 + signed_size + ad_size);
    if (scratch == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    unsigned char *inner = scratch, *signed_at = scratch + longest + 1,
                  *ad = signed_at + signed_size;
    aead_decrypt_fn decrypt = (aead_decrypt_fn)(uintptr_t)decrypt_addr;
    verify_detached_fn verify = (verify_detached_fn)(uintptr_t)verify_addr;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        open_one(decrypt, verify, sig_prefix, sig_prefix_len, ad_prefix, ad_prefix_len, inner,
                 signed_at, ad, &items[i]);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char answer = items[i].answer;
        int opened = answer != OPENED_AUTHENTICATION && answer != OPENED_NO_ROOM;
        PyObject *head = opened ? PyList_GET_ITEM(heads, i) : Py_None;
        PyObject *body = opened ? PyList_GET_ITEM(bodies, i) : Py_None;
        PyObject *entry = Py_BuildValue("(iOO)", (int)answer, head, body);
        if (entry == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, entry);
    }
done:
    PyMem_Free(scratch);
    PyMem_Free(items);
    Py_XDECREF(heads);
    Py_XDECREF(bodies);
    return result;
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, check_doc},
    {"settle", settle, METH_VARARGS, settle_doc},
    {"seal", seal_envelope, METH_VARARGS, seal_doc},
    {"open_sealed", open_sealed, METH_VARARGS, open_sealed_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_ed25519_batch",
    "Many ed25519 checks per GIL release (see sdk/documents/verifier.py).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__ed25519_batch(void)
{
    if (PyType_Ready(&FeedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FeedType);
    if (PyModule_AddObject(m, "Feed", (PyObject *)&FeedType) < 0) {
        Py_DECREF(&FeedType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
