"""Batch signature checks (``sdk.documents.verifier`` behind ``bamboo.SignatureChecks``).

Whatever does the checking (the compiled loop or PyNaCl, on the calling thread or
on one or several verification threads, with a task failing or the batch
cancelled half way), every answer must be ``signature_ok``'s, one by one.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sdk.documents import KeyPair, UsageError, sign_entry, verifier
from sdk.documents.bamboo import (
    PARALLEL_VERIFY_MIN,
    VERIFY_CHUNK,
    Entry,
    SignatureChecks,
    decode_entry,
    signature_ok,
    start_verifying,
    verify_signatures,
)

from .test_signature_rule import CASES, reference_verify

_ed25519_batch = verifier._ed25519_batch
native_only = pytest.mark.skipif(_ed25519_batch is None, reason="the compiled loop is not built")

RNG = random.Random(4242)
#: (threads, compiled loop): inline, one thread, several threads (chunks dealt
#: round robin), and the PyNaCl fallback on threads.
SETUPS = [(0, True), (1, True), (3, True), (1, False), (3, False)]


def _signed_pool() -> list[Entry]:
    keys = [KeyPair.generate() for _ in range(4)]
    return [decode_entry(sign_entry(keys[n % 4], n, 1, b"op %d" % n).encoded) for n in range(160)]


POOL = _signed_pool()


def forged(entry: Entry, where: int) -> Entry:
    """``entry`` with one bit flipped: in the signature (even) or the signed bytes (odd)."""
    data = bytearray(entry.encoded)
    if where % 2:
        data[-65 - where % 40] ^= 1 << (where % 8)
    else:
        data[-1 - where % 64] ^= 1 << (where % 8)
    return _raw(bytes(data[1:33]), bytes(data[:-64]), bytes(data[-64:]))


def _raw(author: bytes, signed: bytes, signature: bytes) -> Entry:
    """An entry object carrying arbitrary key, signed bytes and signature."""
    return Entry(
        author=author,
        log_id=0,
        seq_num=1,
        backlink=None,
        lipmaa_link=None,
        payload_size=0,
        payload_hash=b"",
        signature=signature,
        encoded=signed + signature,
        hash=b"",
    )


def expected(entries: list[Entry]) -> list[bool]:
    return [signature_ok(e.author, e.encoded[:-64], e.signature) for e in entries]


@pytest.fixture(params=SETUPS, ids=[f"threads={t},native={n}" for t, n in SETUPS])
def setup(request: pytest.FixtureRequest) -> Iterator[tuple[int, bool]]:
    threads, native = request.param
    verifier.configure(threads=threads, native=native)
    yield threads, native
    verifier.configure()


def test_the_compiled_loop_is_built() -> None:
    """scripts/bootstrap builds it; without it every check goes through PyNaCl."""
    verifier.configure()
    assert verifier._ed25519_batch is not None, "run scripts/bootstrap (pip install -e .)"
    assert verifier.settings()[1]


def test_crafted_cases_in_a_batch(setup: tuple[int, bool]) -> None:
    """The rule's edge cases (small-order keys and R, non-canonical encodings, torsion)."""
    cases = [_raw(pk, message, sig) for _, pk, message, sig in CASES]
    batch = (cases + POOL[: 2 * VERIFY_CHUNK])[:]
    RNG.shuffle(batch)
    checks = start_verifying(batch)
    answers = [checks.valid(i) for i in range(len(batch))]
    assert answers == expected(batch)
    by_case = {id(entry): name for entry, (name, *_) in zip(cases, CASES, strict=True)}
    for entry, answer in zip(batch, answers, strict=True):
        if id(entry) in by_case:
            assert answer == reference_verify(entry.author, entry.encoded[:-64], entry.signature)


@pytest.mark.parametrize(
    "size",
    [
        1,
        PARALLEL_VERIFY_MIN - 1,
        PARALLEL_VERIFY_MIN,
        VERIFY_CHUNK - 1,
        VERIFY_CHUNK,
        VERIFY_CHUNK + 1,
        2 * VERIFY_CHUNK,
        2 * VERIFY_CHUNK + 1,
    ],
)
def test_chunk_boundaries(setup: tuple[int, bool], size: int) -> None:
    batch = [forged(e, n) if n % 7 == 3 else e for n, e in enumerate(POOL[:size])]
    batch[-1] = forged(batch[-1], size)  # the last entry of the last chunk
    want = expected(batch)
    assert verify_signatures(batch) == want
    checks = start_verifying(batch)
    order = list(range(size))
    RNG.shuffle(order)
    assert [checks.valid(i) for i in order] == [want[i] for i in order]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    picks=st.lists(st.tuples(st.integers(0, len(POOL) - 1), st.integers(-1, 200)), max_size=150),
    seed=st.integers(0, 2**16),
)
def test_random_batches_agree_with_one_by_one(
    setup: tuple[int, bool], picks: list[tuple[int, int]], seed: int
) -> None:
    batch = [POOL[i] if where < 0 else forged(POOL[i], where) for i, where in picks]
    want = expected(batch)
    checks = start_verifying(batch)
    order = list(range(len(batch)))
    random.Random(seed).shuffle(order)
    assert [checks.valid(i) for i in order] == [want[i] for i in order]
    assert checks.all() == want


def test_cancel_leaves_every_answer_right(setup: tuple[int, bool]) -> None:
    batch = [forged(e, n) if n % 11 == 5 else e for n, e in enumerate(POOL)]
    want = expected(batch)
    checks = start_verifying(batch)
    checks.cancel()
    assert checks.all() == want
    halfway = start_verifying(batch)
    assert [halfway.valid(i) for i in range(40)] == want[:40]
    halfway.cancel()
    assert halfway.all() == want


def test_a_task_that_dies_mid_batch_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verification task failing after its first chunk: the caller checks the rest."""
    verifier.configure(threads=2, native=True)
    real = verifier._native if verifier._native is not None else None
    calls: list[int] = []

    def dies_after_one_chunk(
        address: int,
        authors: list[bytes],
        encoded: list[bytes],
        signatures: list[bytes],
        answers: bytearray,
        first_chunk: int,
        chunk_step: int,
        chunk_size: int,
        stop: bytearray,
    ) -> int:
        if chunk_size == 1:  # the caller's own checks
            if real is None:
                return verifier._check_in_python(
                    authors, encoded, signatures, answers, first_chunk, chunk_step, 1, stop
                )
            return real(
                address, authors, encoded, signatures, answers, first_chunk, chunk_step, 1, stop
            )
        calls.append(first_chunk)
        one = chunk_step * 10**6  # step past the batch after the first chunk
        if real is None:
            verifier._check_in_python(
                authors, encoded, signatures, answers, first_chunk, one, chunk_size, stop
            )
        else:
            real(address, authors, encoded, signatures, answers, first_chunk, one, chunk_size, stop)
        raise RuntimeError("verification task died")

    try:
        monkeypatch.setattr(verifier, "_native", dies_after_one_chunk)
        batch = [forged(e, n) if n % 9 == 4 else e for n, e in enumerate(POOL)]
        checks = start_verifying(batch)
        assert checks.all() == expected(batch)
        for task in checks._checks._tasks:
            assert isinstance(task.exception(), RuntimeError)
        assert sorted(calls) == [0, 1]
    finally:
        verifier.configure()


def test_a_task_that_fails_at_once_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    verifier.configure(threads=1, native=False)

    def fails(*args: object) -> int:
        if args[6] == 1:  # chunk_size 1: the caller's own checks
            return real(*args)  # type: ignore[arg-type]
        raise MemoryError("no room for the batch")

    real = verifier._check_in_python
    try:
        monkeypatch.setattr(verifier, "_check_in_python", fails)
        batch = [forged(e, n) if n % 4 == 1 else e for n, e in enumerate(POOL)]
        assert verify_signatures(batch) == expected(batch)
        assert verify_signatures(batch[:5]) == expected(batch[:5])
    finally:
        verifier.configure()


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.setenv("CHORUS_VERIFY_THREADS", "0")
        monkeypatch.setenv("CHORUS_VERIFY_NATIVE", "0")
        verifier.configure()
        assert verifier.settings() == (0, False)
        assert verify_signatures(POOL[:50]) == [True] * 50
        monkeypatch.setenv("CHORUS_VERIFY_THREADS", "two")
        with pytest.raises(UsageError, match="CHORUS_VERIFY_THREADS"):
            verifier.configure()
        with pytest.raises(UsageError):
            verifier.configure(threads=-1)
    finally:
        monkeypatch.delenv("CHORUS_VERIFY_THREADS")
        monkeypatch.delenv("CHORUS_VERIFY_NATIVE")
        verifier.configure()


def test_mismatched_lists_are_refused() -> None:
    with pytest.raises(UsageError):
        verifier.LibsodiumChecks([b"a"], [], [])


def _growing(batch: list[Entry], capacity: int | None = None) -> SignatureChecks:
    checks = SignatureChecks.growing(capacity or max(len(batch), 1))
    for entry in batch:
        checks.add(entry)
    return checks


@pytest.mark.parametrize("size", [1, PARALLEL_VERIFY_MIN, VERIFY_CHUNK, 2 * VERIFY_CHUNK + 5, 160])
def test_a_growing_batch_gives_the_same_answers(setup: tuple[int, bool], size: int) -> None:
    """Checks started chunk by chunk as entries are added answer as ``signature_ok``."""
    batch = [forged(e, n) if n % 9 == 4 else e for n, e in enumerate(POOL[:size])]
    batch[-1] = forged(batch[-1], size)
    want = expected(batch)
    checks = _growing(batch, capacity=200)
    checks.seal()
    order = list(range(size))
    RNG.shuffle(order)
    assert [checks.valid(i) for i in order] == [want[i] for i in order]


def test_a_growing_batch_is_checked_before_it_is_sealed() -> None:
    """From the first entry on, a verification thread checks entries as they are added."""
    verifier.configure(threads=1, native=True)
    try:
        checks = verifier.LibsodiumChecks.growing(4 * VERIFY_CHUNK)
        feed = checks._feed
        assert feed is not None
        for entry in POOL[: VERIFY_CHUNK + 3]:
            checks.add(entry.author, entry.encoded, entry.signature)
        assert len(checks._tasks) == 1
        _until(lambda: feed.taken == VERIFY_CHUNK + 3 and feed.waiting == 1)
        assert verifier.PENDING not in checks._answers[: VERIFY_CHUNK + 3]
        for entry in POOL[VERIFY_CHUNK + 3 : 2 * VERIFY_CHUNK + 10]:
            checks.add(entry.author, entry.encoded, entry.signature)
        checks.seal()
        assert checks._tasks[0].result() == 2 * VERIFY_CHUNK + 10
        assert all(checks.accepted(i) for i in range(2 * VERIFY_CHUNK + 10))
    finally:
        verifier.configure()


def _until(condition: Callable[[], bool]) -> None:
    """Spin until ``condition()`` holds: the tests synchronize on the state the feed
    exposes (pytest-timeout ends a test that would wait for ever)."""
    while not condition():
        os.sched_yield()


def _run_in_thread(feed: object, answers: bytearray) -> tuple[threading.Thread, list[int]]:
    """A runner on its own thread, with no idle limit: only add, seal or stop end its waits."""
    out: list[int] = []
    address = verifier._libsodium_address()
    thread = threading.Thread(target=lambda: out.append(feed.run(address, answers, 1e9)))  # type: ignore[attr-defined]
    thread.start()
    return thread, out


def _libsodium_answers(batch: list[Entry]) -> bytearray:
    return bytearray(
        verifier.ACCEPTED
        if verifier.libsodium_accepts(e.author, e.encoded, e.signature)
        else verifier.REFUSED
        for e in batch
    )


@native_only
def test_a_waiting_runner_is_woken_by_add_then_by_seal() -> None:
    batch = [forged(e, n) if n % 3 == 1 else e for n, e in enumerate(POOL[:6])]
    feed = _ed25519_batch.Feed(len(batch))
    answers = bytearray(len(batch))
    thread, out = _run_in_thread(feed, answers)
    for n, entry in enumerate(batch):
        _until(lambda: feed.waiting == 1)  # asleep in C, nothing to take
        assert feed.add(entry.author, entry.encoded, entry.signature) == n
        _until(lambda n=n: answers[n] in (verifier.ACCEPTED, verifier.REFUSED))  # type: ignore[misc]
    _until(lambda: feed.waiting == 1)
    feed.seal()
    thread.join()
    assert out == [len(batch)]
    assert answers == _libsodium_answers(batch)


@native_only
def test_a_runner_waiting_on_an_empty_feed_returns_at_seal_or_stop() -> None:
    for end in ("seal", "stop"):
        feed = _ed25519_batch.Feed(4)
        thread, out = _run_in_thread(feed, bytearray(4))
        _until(lambda feed=feed: feed.waiting == 1)  # type: ignore[misc]
        getattr(feed, end)()
        thread.join()
        assert out == [0] and feed.waiting == 0


@native_only
def test_a_stopped_feed_hands_nothing_out_and_a_sealed_one_is_finished_first() -> None:
    batch = POOL[:40]
    feed = _ed25519_batch.Feed(len(batch))
    for entry in batch:
        feed.add(entry.author, entry.encoded, entry.signature)
    feed.seal()  # sealed before any runner: it still checks every entry, then returns
    answers = bytearray(len(batch))
    thread, out = _run_in_thread(feed, answers)
    thread.join()
    assert out == [len(batch)] and answers == _libsodium_answers(batch)
    stopped = _ed25519_batch.Feed(len(batch))
    for entry in batch:
        stopped.add(entry.author, entry.encoded, entry.signature)
    stopped.stop()
    untouched = bytearray(len(batch))
    thread, out = _run_in_thread(stopped, untouched)
    thread.join()
    assert out == [0] and untouched == bytearray(len(batch))


@native_only
def test_every_entry_of_a_feed_is_checked_exactly_once() -> None:
    """Two runners and the caller's own checks (from the end) race; each entry is
    answered once, by whoever claimed it."""
    batch = [forged(e, n) if n % 5 == 2 else e for n, e in enumerate(POOL)]
    feed = _ed25519_batch.Feed(len(batch))
    answers = bytearray(len(batch))
    runners = [_run_in_thread(feed, answers) for _ in range(2)]
    address = verifier._libsodium_address()
    authors = [e.author for e in batch]
    encoded = [e.encoded for e in batch]
    signatures = [e.signature for e in batch]
    mine = 0
    for n, entry in enumerate(batch):
        feed.add(entry.author, entry.encoded, entry.signature)
        if n % 4 == 3:  # the caller checks one entry from the end of what is in
            mine += _ed25519_batch.check(
                address,
                authors[: n + 1],
                encoded[: n + 1],
                signatures[: n + 1],
                answers,
                n,
                len(batch),
                1,
                bytearray(1),
            )
    feed.seal()
    for thread, _ in runners:
        thread.join()
    assert mine + sum(out[0] for _, out in runners) == len(batch)
    assert answers == _libsodium_answers(batch)


@native_only
def test_settle_waits_for_the_claimed_answer() -> None:
    """The caller asking for an entry a runner holds sleeps until the answer is out."""
    feed = _ed25519_batch.Feed(2)
    answers = bytearray(2)
    answers[0] = verifier.CLAIMED  # held by someone
    settled: list[int] = []
    settler = threading.Thread(target=lambda: settled.append(feed.settle(answers, 0)))
    settler.start()
    thread, out = _run_in_thread(feed, answers)
    _until(lambda: feed.waiting == 1)
    answers[0] = verifier.REFUSED
    entry = POOL[0]
    feed.add(entry.author, entry.encoded, entry.signature)
    feed.add(entry.author, entry.encoded, entry.signature)
    feed.seal()
    settler.join()
    thread.join()
    assert settled == [verifier.REFUSED]
    assert out == [1] and answers[1] == verifier.ACCEPTED  # entry 0 was not the runner's
    assert feed.settle(answers, 1) == verifier.ACCEPTED
    with pytest.raises(IndexError):
        feed.settle(answers, 2)


@native_only
def test_a_feed_refuses_misuse() -> None:
    with pytest.raises(ValueError):
        _ed25519_batch.Feed(0)
    feed = _ed25519_batch.Feed(1)
    with pytest.raises(TypeError):
        feed.add("author", b"", b"")
    assert feed.count == 0
    feed.add(b"", b"", b"")
    with pytest.raises(ValueError):
        feed.add(b"", b"", b"")
    with pytest.raises(ValueError):
        feed.run(verifier._libsodium_address(), bytearray(0), 1.0)  # answers too short
    answers = bytearray(1)
    feed.seal()
    assert feed.run(verifier._libsodium_address(), answers, 1.0) == 1
    assert answers[0] == verifier.REFUSED  # malformed: the caller asks the full rule


@native_only
def test_cancelling_a_growing_batch_wakes_its_waiting_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(verifier, "IDLE_WAIT", 1e9)  # only cancel can end the wait
    verifier.configure(threads=1, native=True)
    try:
        batch = [forged(e, n) if n % 6 == 0 else e for n, e in enumerate(POOL[:50])]
        checks = _growing(batch[:20], capacity=len(batch))
        feed = checks._checks._feed
        assert feed is not None
        _until(lambda: feed.taken == 20 and feed.waiting == 1)
        checks.cancel()
        assert checks._checks._tasks[0].result() == 20
        for entry in batch[20:]:
            checks.add(entry)  # nothing is checked by the thread any more
        checks.seal()
        assert feed.taken == 20
        assert checks.all() == expected(batch)
    finally:
        verifier.configure()


@native_only
def test_a_growing_batch_dropped_unsealed_releases_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(verifier, "IDLE_WAIT", 1e9)
    verifier.configure(threads=1, native=True)
    try:
        checks = _growing(POOL[:3], capacity=10)
        feed = checks._checks._feed
        assert feed is not None
        task = checks._checks._tasks[0]
        _until(lambda: feed.taken == 3 and feed.waiting == 1)
        del checks
        gc.collect()
        assert task.result() == 3
    finally:
        verifier.configure()


def test_an_abandoned_growing_batch_does_not_hold_up_interpreter_exit() -> None:
    """A batch never sealed nor cancelled: its thread gives up after IDLE_WAIT."""
    script = (
        "from sdk.documents import KeyPair, sign_entry, verifier\n"
        "from sdk.documents.bamboo import SignatureChecks, decode_entry\n"
        "verifier.configure(threads=1)\n"
        "key = KeyPair.generate()\n"
        "checks = SignatureChecks.growing(100)\n"
        "for n in range(5):\n"
        "    checks.add(decode_entry(sign_entry(key, n, 1, b'x').encoded))\n"
        "print(checks._checks._feed is not None, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.stdout.strip() == str(verifier._ed25519_batch is not None)


def test_without_the_compiled_loop_a_growing_batch_checks_in_rounds() -> None:
    """PyNaCl per check: no feed; threads start at the first full chunk, same answers."""
    verifier.configure(threads=1, native=False)
    try:
        batch = [forged(e, n) if n % 7 == 2 else e for n, e in enumerate(POOL)]
        checks = SignatureChecks.growing(len(batch))
        for n, entry in enumerate(batch):
            checks.add(entry)
            assert checks._checks._feed is None
            assert bool(checks._checks._tasks) == (n + 1 >= VERIFY_CHUNK)
        checks.seal()
        assert checks.all() == expected(batch)
    finally:
        verifier.configure()


def test_a_growing_batch_cancelled_half_way_answers_right(setup: tuple[int, bool]) -> None:
    batch = [forged(e, n) if n % 11 == 5 else e for n, e in enumerate(POOL)]
    want = expected(batch)
    checks = _growing(batch[:100], capacity=len(batch))
    checks.cancel()
    for entry in batch[100:]:
        checks.add(entry)  # nothing is handed out after a cancel: checked when asked
    checks.seal()
    assert checks.all() == want


def test_a_growing_batch_refuses_misuse() -> None:
    checks = SignatureChecks.growing(2)
    checks.add(POOL[0])
    checks.add(POOL[1])
    with pytest.raises(UsageError):
        checks.add(POOL[2])
    with pytest.raises(IndexError):
        verifier.LibsodiumChecks.growing(4).accepted(0)
    checks.seal()
    with pytest.raises(UsageError):
        checks.add(POOL[2])
    with pytest.raises(UsageError):
        SignatureChecks.growing(0)
    assert checks.covers(POOL[:2]) and not checks.covers(POOL[1:3])
