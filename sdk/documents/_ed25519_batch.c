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
 * signature_ok, again).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>

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
        unsigned char expected = PENDING;
        if (!__atomic_compare_exchange_n(&out[indices[k]], &expected, CLAIMED, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        const item_t *it = &items[k];
        unsigned char answer = REFUSED;
        if (it->author_len == AUTHOR_SIZE && it->signature_len == SIGNATURE_SIZE) {
            /* The signed bytes are the encoding without its last 64 bytes
             * (Python's encoded[:-64]: empty when shorter). */
            Py_ssize_t mlen = it->encoded_len > SIGNATURE_SIZE
                                  ? it->encoded_len - SIGNATURE_SIZE
                                  : 0;
            if (verify(it->signature, it->encoded, (unsigned long long)mlen, it->author) == 0)
                answer = ACCEPTED;
        }
        __atomic_store_n(&out[indices[k]], answer, __ATOMIC_RELEASE);
        written++;
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

PyDoc_STRVAR(settle_doc,
"settle(answers, index)\n"
"--\n\n"
"answers[index] once it is no longer 3 (claimed: another thread is checking it),\n"
"waited for with the GIL released.");

static PyObject *
settle(PyObject *self, PyObject *args)
{
    Py_buffer answers;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "w*n", &answers, &index))
        return NULL;
    if (index < 0 || index >= answers.len) {
        PyBuffer_Release(&answers);
        PyErr_SetString(PyExc_IndexError, "answer index out of range");
        return NULL;
    }
    unsigned char *at = (unsigned char *)answers.buf + index;
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

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS, check_doc},
    {"settle", settle, METH_VARARGS, settle_doc},
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
    return PyModule_Create(&module);
}
