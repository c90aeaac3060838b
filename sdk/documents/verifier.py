"""libsodium's answers for a batch of entry signatures, off the caller's GIL.

:class:`~sdk.documents.bamboo.SignatureChecks` asks this module what libsodium
(``crypto_sign_verify_detached``, the check PyNaCl's ``crypto_sign_open`` makes)
says about each signature of a batch, while the caller's thread decodes, checks
links and writes entry after entry. Only acceptance is final here: a refusal is
handed back, and :func:`~sdk.documents.bamboo.signature_ok` (the one rule, with
its OpenSSL second opinion) decides it.

Why a compiled loop. PyNaCl's cffi call releases the GIL for one check, but the
verification thread must take the GIL back before the next one; while the
caller's thread holds it (decoding, SQL) that thread waits for the 5 ms switch
interval. Measured here, 2,000 checks on a verification thread while the caller's
thread ran Python: 463 us per check through PyNaCl (66 us idle), 136 us through
``_ed25519_batch.c``, which checks many signatures per GIL release (the rest was
the other core's load). A worker process would free the GIL too, but costs a
spawned interpreter, copying every entry through a pipe and a process to watch
and reap; the loop costs none of that. libsodium is not linked: the loop calls
the ``crypto_sign_verify_detached`` that PyNaCl's own library exports (and
initialised), by address, so the answers are those ``crypto_sign_open`` gives.

How a batch is shared. Each answer is one byte of a shared buffer: pending,
claimed (being checked), accepted or refused; an entry is claimed atomically
before it is checked, so no entry is checked twice. The verification threads
take the batch in :data:`VERIFY_CHUNK`-entry chunks, dealt round robin (chunk
``k`` to thread ``k mod threads``), each thread checking its chunks in batch
order in one call. The caller never sleeps: an answer still pending when it is
asked for is checked on the caller's thread; one being checked by a thread is
waited for, the caller meanwhile checking entries from the end of the batch
(which the threads then skip), so when verification is the slower side both
cores verify. A task that fails before it starts or is cancelled leaves its
entries pending, and the caller checks them as it reaches them: nothing is lost
or judged differently. Batches below :data:`PARALLEL_VERIFY_MIN` entries are
checked on the calling thread.

A growing batch (entries added as they are decoded) is a ``Feed`` of the compiled
module: :meth:`LibsodiumChecks.add` keeps references to the entry's bytes in
arrays of fixed capacity and publishes the new count atomically; the threads stay
in one call for the whole batch, take entries in order through a shared cursor
and, having caught up, sleep on a condition variable that ``add``, ``seal`` and
``cancel`` signal, all without the GIL. Before, a thread took the GIL back after
every round and waited for more in Python, each time for up to the switch
interval while the caller ran Python, and fell behind the caller, who then
checked signatures itself. A caller waiting for an entry a thread holds sleeps
until that thread writes it. A thread leaves a batch that is dropped, or gets
no entry for :data:`IDLE_WAIT` seconds, so none waits at interpreter exit.

The extension is built at install (``pyproject.toml``, ``optional``): where it is
missing (no compiler) or switched off, each check goes through PyNaCl, on the
same threads and with the same answers (without the atomic claim, an entry may
then be checked twice).

The same extension seals and opens the encrypted channels' envelopes
(:func:`sealed_envelope_calls`: one call signs and seals a message; one call opens
a batch's seals and verifies its signatures with the GIL released once), bound to
the same library by address; ``CHORUS_VERIFY_NATIVE=0`` switches those off too.

Configuration (environment, read at first use, or :func:`configure`):

* ``CHORUS_VERIFY_THREADS``: verification threads (default: one fewer than the
  machine's cores, at most 4); ``0`` checks every batch on the calling thread.
* ``CHORUS_VERIFY_NATIVE``: ``0`` bypasses the compiled loop (PyNaCl per check).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import nacl._sodium
from nacl.bindings import crypto_sign_open
from nacl.exceptions import BadSignatureError

from sdk.documents.errors import UsageError

try:
    from sdk.documents import _ed25519_batch
except ImportError:  # built without a compiler: PyNaCl per check
    _ed25519_batch = None  # type: ignore[assignment]

#: Below this many entries the checks run on the calling thread.
PARALLEL_VERIFY_MIN = 32
#: Entries per chunk dealt to one verification thread: with several threads, small
#: enough that the first answers come back early.
VERIFY_CHUNK = 64

#: Seconds a verification thread waits for the next entry of a growing batch that is
#: neither sealed nor cancelled before it leaves the rest to the caller.
IDLE_WAIT = 0.25

#: An answer's byte (``_ed25519_batch.c`` uses the same values): not checked yet,
#: libsodium accepted, libsodium refused (or wrong lengths), being checked.
PENDING = 0
ACCEPTED = 1  #: see PENDING
REFUSED = 2  #: see PENDING
CLAIMED = 3  #: see PENDING

_AUTHOR_SIZE = 32
_SIGNATURE_SIZE = 64

#: ``check(address, authors, encoded, signatures, answers, first_chunk, chunk_step,
#: chunk_size, stop) -> written`` (see ``_ed25519_batch.c``).
_CheckFn = Callable[
    [int, list[bytes], list[bytes], list[bytes], bytearray, int, int, int, bytearray], int
]

_lock = threading.Lock()
_configured = False
_threads = 0
_native: _CheckFn | None = None
_address = 0
_pool: ThreadPoolExecutor | None = None


def _default_threads() -> int:
    return max(0, min(4, (os.cpu_count() or 1) - 1))


def _libsodium_address() -> int:
    """Address of ``crypto_sign_verify_detached`` in the library PyNaCl loaded (0 if none)."""
    try:
        function = ctypes.CDLL(nacl._sodium.__file__).crypto_sign_verify_detached
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(function, ctypes.c_void_p).value or 0


def configure(threads: int | None = None, native: bool | None = None) -> None:
    """Set the verification threads and whether the compiled loop is used.

    ``None`` takes the value from the environment (module docstring) or the
    default. A batch started before keeps its running checks; its queued ones are
    dropped and its caller checks those entries as it reaches them.
    """
    global _configured, _threads, _native, _address, _pool
    if threads is None:
        raw = os.environ.get("CHORUS_VERIFY_THREADS", "").strip()
        try:
            threads = int(raw) if raw else _default_threads()
        except ValueError:
            raise UsageError(
                f"CHORUS_VERIFY_THREADS must be a whole number of threads, not {raw!r}"
            ) from None
    if threads < 0:
        raise UsageError(f"verification threads must be 0 or more, not {threads}")
    if native is None:
        native = os.environ.get("CHORUS_VERIFY_NATIVE", "1").strip() != "0"
    with _lock:
        old, _pool = _pool, None
        _threads = threads
        _native = None
        if native and _ed25519_batch is not None:
            _address = _address or _libsodium_address()
            if _address:
                _native = _ed25519_batch.check
        _configured = True
    if old is not None:
        old.shutdown(wait=False, cancel_futures=True)


def settings() -> tuple[int, bool]:
    """The verification threads in use and whether the compiled loop checks them."""
    _ensure_configured()
    return _threads, _native is not None


def _ensure_configured() -> None:
    if not _configured:
        configure()


def _submit(task: Callable[[], int]) -> Future[int] | None:
    global _pool
    with _lock:
        if _threads == 0:
            return None
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_threads, thread_name_prefix="verify")
        try:
            return _pool.submit(task)
        except RuntimeError:  # shut down at interpreter exit
            return None


def libsodium_accepts(author: bytes, encoded: bytes, signature: bytes) -> bool:
    """Whether libsodium accepts ``signature`` over ``encoded[:-64]`` by ``author``."""
    if len(author) != _AUTHOR_SIZE or len(signature) != _SIGNATURE_SIZE:
        return False
    try:
        crypto_sign_open(signature + encoded[:-_SIGNATURE_SIZE], author)
    except (BadSignatureError, ValueError):
        return False
    return True


def _check_in_python(
    authors: list[bytes],
    encoded: list[bytes],
    signatures: list[bytes],
    answers: bytearray,
    first_chunk: int,
    chunk_step: int,
    chunk_size: int,
    stop: bytearray,
) -> int:
    """What ``_ed25519_batch.check`` does, through PyNaCl one check at a time.

    Without the atomic claim: an entry the caller checks meanwhile may be checked
    twice, with the same answer.
    """
    written = 0
    n = len(authors)
    for start in range(first_chunk * chunk_size, n, chunk_step * chunk_size):
        for i in range(start, min(start + chunk_size, n)):
            if stop[0]:
                return written
            if answers[i] != PENDING:
                continue
            ok = libsodium_accepts(authors[i], encoded[i], signatures[i])
            answers[i] = ACCEPTED if ok else REFUSED
            written += 1
    return written


def check_on_this_thread(
    authors: list[bytes], encoded: list[bytes], signatures: list[bytes]
) -> list[bool]:
    """libsodium's answer for each entry (as :func:`libsodium_accepts`), all checked on
    the calling thread: with the compiled loop, in one call that releases the GIL once
    for the whole batch, so a worker thread running it leaves the interpreter to the
    event loop until every answer is known (the encrypted channels' signatures,
    ``docs/encryption.md``)."""
    if not len(authors) == len(encoded) == len(signatures):
        raise UsageError("authors, encoded and signatures must have one item per entry")
    _ensure_configured()
    n = len(authors)
    answers = bytearray(n)
    args = (authors, encoded, signatures, answers, 0, 1, max(n, 1), bytearray(1))
    if _native is not None:
        _native(_address, *args)
    else:
        _check_in_python(*args)
    return [answer == ACCEPTED for answer in answers]


def libsodium_function(name: str) -> int:
    """Address of libsodium function ``name`` in the library PyNaCl loaded (0 if none)."""
    try:
        function = getattr(ctypes.CDLL(nacl._sodium.__file__), name)
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(function, ctypes.c_void_p).value or 0


#: ``_ed25519_batch.open_sealed``'s answer per envelope: ``(answer, head, sds)``.
_OpenedAnswers = list[tuple[int, bytes | None, bytes | None]]
#: ``(sealer, opener)`` of :func:`sealed_envelope_calls`, once looked up.
_sealed_calls: tuple[Callable[..., bytes], Callable[..., _OpenedAnswers]] | None = None


def sealed_envelope_calls() -> tuple[Callable[..., bytes], Callable[..., _OpenedAnswers]] | None:
    """The compiled loop's envelope calls for ``sdk.encryption`` (``docs/encryption.md``,
    "Costs"), bound to the libsodium PyNaCl loaded, or ``None`` where the compiled loop is
    missing or switched off (:func:`configure`): then the encryption layer seals and opens
    through PyNaCl's library in Python, with the same bytes and answers.

    ``sealer(secret_key, sig_prefix, ad_prefix, epoch, timestamp, signer, key, sds)`` is
    ``_ed25519_batch.seal`` and ``opener(sig_prefix, ad_prefix, envelopes, keys, rosters)``
    ``_ed25519_batch.open_sealed`` (which releases the GIL once for the whole batch)."""
    global _sealed_calls
    _ensure_configured()
    if _native is None or not hasattr(_ed25519_batch, "open_sealed"):
        return None
    if _sealed_calls is None:
        names = (
            "crypto_sign_detached",
            "crypto_aead_xchacha20poly1305_ietf_encrypt",
            "randombytes_buf",
            "crypto_aead_xchacha20poly1305_ietf_decrypt",
        )
        sign, encrypt, random, decrypt = (libsodium_function(name) for name in names)
        if not (sign and encrypt and random and decrypt and _address):
            return None
        _sealed_calls = (
            functools.partial(_ed25519_batch.seal, sign, encrypt, random),
            functools.partial(_ed25519_batch.open_sealed, decrypt, _address),
        )
    return _sealed_calls


class LibsodiumChecks:
    """libsodium's answers for one batch, being computed (module docstring).

    ``authors[i]``, ``encoded[i]`` and ``signatures[i]`` are entry ``i``'s key,
    wire form (the signature covers all but its last 64 bytes) and signature.
    The caller never sleeps: an answer not known yet when it is asked for is
    computed on the asking thread, unless a verification thread is computing it
    right now (then it is waited for, one check at most).
    """

    __slots__ = (
        "_answers",
        "_authors",
        "_check",
        "_encoded",
        "_feed",
        "_growing",
        "_signatures",
        "_stop",
        "_tail",
        "_tasks",
    )

    def __init__(self, authors: list[bytes], encoded: list[bytes], signatures: list[bytes]) -> None:
        if not len(authors) == len(encoded) == len(signatures):
            raise UsageError("authors, encoded and signatures must have one item per entry")
        _ensure_configured()
        n = len(authors)
        self._authors = authors
        self._encoded = encoded
        self._signatures = signatures
        self._answers = bytearray(n)
        self._stop = bytearray(1)
        self._tail = n - 1
        self._check = _native
        self._tasks: list[Future[int]] = []
        self._growing: threading.Event | None = None
        self._feed: _ed25519_batch.Feed | None = None
        step = min(_threads, -(-n // VERIFY_CHUNK))
        if n >= PARALLEL_VERIFY_MIN and step > 0:
            for k in range(step):
                task = _submit(self._task(k, step))
                if task is None:
                    break
                self._tasks.append(task)
        if not self._tasks:
            # What a failure leaves unanswered is checked one by one in accepted().
            with contextlib.suppress(Exception):
                self._run(0, 1, VERIFY_CHUNK, self._stop)

    @classmethod
    def growing(cls, capacity: int) -> LibsodiumChecks:
        """An empty batch of up to ``capacity`` entries, checked as they are :meth:`add`-ed.

        With the compiled loop, the verification threads start at the first entry
        and stay in one call of ``Feed.run`` until the batch is sealed (or
        cancelled, dropped, or left without a new entry for :data:`IDLE_WAIT`
        seconds): they take the entries in order and, having caught up, sleep
        without the GIL until :meth:`add` publishes the next one, so no thread
        needs the interpreter in between. Through PyNaCl, threads start once
        :data:`VERIFY_CHUNK` entries are in and check what was added in rounds,
        taking the GIL per check. :meth:`seal` says no more will come.
        """
        if capacity < 1:
            raise UsageError(f"a growing batch holds at least one entry, not {capacity}")
        checks = cls([], [], [])
        checks._answers = bytearray(capacity)  # never resized: threads write into it
        checks._growing = threading.Event()
        if checks._check is not None and _threads > 0:
            checks._feed = _ed25519_batch.Feed(capacity)
        return checks

    def add(self, author: bytes, encoded: bytes, signature: bytes) -> None:
        """Append an entry to a :meth:`growing` batch (its index is the count before)."""
        more = self._growing
        if more is None:
            raise UsageError("add entries to a growing batch before it is sealed")
        n = len(self._authors)
        if n == len(self._answers):
            raise UsageError(f"the batch holds {n} entries at most")
        feed = self._feed
        if feed is not None:
            feed.add(author, encoded, signature)  # wakes a thread waiting for it
        self._authors.append(author)
        self._encoded.append(encoded)
        self._signatures.append(signature)
        self._tail = n
        if feed is not None:
            if n == 0 and not self._stop[0]:
                self._start_feed(feed)
        elif (n + 1) % VERIFY_CHUNK == 0:
            if self._tasks:
                more.set()
            else:
                self._start_rounds(more)

    def seal(self) -> None:
        """End a :meth:`growing` batch: what is left of it is checked too."""
        more, self._growing = self._growing, None
        if more is None:
            return
        more.set()
        if self._feed is not None:
            self._feed.seal()
        elif not self._tasks and len(self._authors) >= PARALLEL_VERIFY_MIN:
            self._start_rounds(more)

    def _start_rounds(self, more: threading.Event) -> None:
        for _ in range(_threads):
            task = _submit(lambda: self._rounds(more))
            if task is None:
                break
            self._tasks.append(task)

    def _start_feed(self, feed: _ed25519_batch.Feed) -> None:
        answers, address = self._answers, _address
        for _ in range(_threads):
            task = _submit(lambda: feed.run(address, answers, IDLE_WAIT))
            if task is None:
                break
            self._tasks.append(task)

    def _rounds(self, more: threading.Event) -> int:
        """A verification thread's work on a growing batch: check what was added, from
        where the last round ended, until the batch is sealed and all checked."""
        written, done = 0, 0
        while not self._stop[0]:
            n = len(self._authors)
            if done < n:
                # Chunks of one entry from ``done`` on: every entry added so far.
                written += self._run(done, 1, 1, self._stop)
                done = n
                continue
            if self._growing is not more:
                return written  # sealed, and every entry was seen
            more.clear()
            if len(self._authors) == done and self._growing is more and not more.wait(0.25):
                # Nothing came for a while (an abandoned batch): the caller checks
                # the rest as it asks for it.
                return written
        return written

    def _task(self, first_chunk: int, step: int) -> Callable[[], int]:
        return lambda: self._run(first_chunk, step, VERIFY_CHUNK, self._stop)

    def _run(self, first_chunk: int, step: int, chunk_size: int, stop: bytearray) -> int:
        args = (
            self._authors,
            self._encoded,
            self._signatures,
            self._answers,
            first_chunk,
            step,
            chunk_size,
            stop,
        )
        if self._check is None:
            return _check_in_python(*args)
        return self._check(_address, *args)

    def accepted(self, index: int) -> bool:
        """Whether libsodium accepts entry ``index``'s signature."""
        if not 0 <= index < len(self._authors):
            raise IndexError(f"no entry {index} in a batch of {len(self._authors)}")
        answer = self._answers[index]
        if answer == PENDING:
            # Not reached by a verification thread (or never will be: it failed or
            # was cancelled): check it here, on a stop flag of its own.
            self._run(index, len(self._answers), 1, bytearray(1))
            answer = self._answers[index]
        if answer == CLAIMED:
            # A verification thread is checking it: rather than wait idle, check
            # entries from the end of the batch, which that thread then skips.
            answers, own_stop = self._answers, bytearray(1)
            while self._tail > index and answers[index] == CLAIMED:
                tail = self._tail
                self._tail = tail - 1
                if answers[tail] == PENDING:
                    self._run(tail, len(answers), 1, own_stop)
            feed = self._feed
            # What is left is the rest of one check: a growing batch's thread wakes
            # the caller when it is written (asleep, should that thread be preempted).
            answer = (
                feed.settle(answers, index)
                if feed is not None
                else _ed25519_batch.settle(answers, index)
            )
        return answer == ACCEPTED

    def cancel(self) -> None:
        """Stop the checks still running or queued; what is asked later is checked inline."""
        self._stop[0] = 1
        if self._feed is not None:
            self._feed.stop()
        if self._growing is not None:
            self._growing.set()
        for task in self._tasks:
            task.cancel()

    def __del__(self) -> None:
        # A growing batch dropped unsealed (nobody will ask for its answers): its
        # threads, which hold the feed but not this object, stop waiting for entries.
        feed = getattr(self, "_feed", None)
        if feed is not None:
            feed.stop()


__all__ = [
    "ACCEPTED",
    "CLAIMED",
    "IDLE_WAIT",
    "PARALLEL_VERIFY_MIN",
    "PENDING",
    "REFUSED",
    "VERIFY_CHUNK",
    "LibsodiumChecks",
    "configure",
    "libsodium_accepts",
    "libsodium_function",
    "sealed_envelope_calls",
    "settings",
]
