"""What an endpoint needs from the place it keeps logs, and an in-memory one.

A store holds *verified* entries only, possibly sparsely (certificate pools
without everything in between), and payloads for some of them. It also
remembers fork proofs: once a log is known to be forked, an endpoint tells its
peers instead of replicating it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sdk.documents.bamboo import Entry, build_entry, lipmaa
from sdk.documents.errors import DocumentError
from sdk.documents.hashing import yasmf_hash
from sdk.documents.keys import KeyPair
from sdk.sync.bamboo_p2p.entries import LogKey, is_end_of_log, sign_log_entry
from sdk.sync.bamboo_p2p.requests import (
    KeepPartial,
    Outcome,
    ReceivedEntry,
    ReceivedPayload,
    Snapshot,
    StoreRead,
    Write,
    Written,
)


class LogStore(Protocol):
    """The storage an :class:`~sdk.sync.bamboo_p2p.endpoint.Endpoint` reads and writes."""

    def entry(self, log: LogKey, seq_num: int) -> Entry | None:
        """The verified entry ``seq_num`` of ``log``, if stored."""

    def payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The payload of entry ``seq_num``, if stored."""

    def put_entry(self, entry: Entry) -> None:
        """Store a verified entry (called only when no other entry has its place)."""

    def put_payload(self, log: LogKey, seq_num: int, payload: bytes) -> None:
        """Store the verified payload of a stored entry."""

    def partial_payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The first bytes of a payload whose transfer was cut, if kept (not verified:
        a payload is checked against its hash only once complete)."""

    def put_partial_payload(self, log: LogKey, seq_num: int, prefix: bytes | None) -> None:
        """Keep the received prefix of a cut payload (``None``: forget it); a proposal
        with a starting offset resumes from it. :meth:`put_payload` forgets it too."""

    def end_of_log(self, log: LogKey) -> int | None:
        """Sequence number of the stored end-of-log entry of ``log``, if any."""

    def fork_proof(self, log: LogKey) -> tuple[Entry, Entry] | None:
        """Two entries proving ``log`` is forked, if known."""

    def record_fork(self, log: LogKey, proof: tuple[Entry, Entry]) -> None:
        """Remember that ``log`` is forked."""

    def latest(self, log: LogKey) -> int:
        """The highest stored sequence number of ``log`` (0 if none)."""

    def flush(self) -> None:
        """Make everything put so far durable. A driver calls it after each batch of the
        peer's bytes, before it reports what was received: nothing is reported as
        received that a crash could still lose."""

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` whenever an entry or payload is put; returns its remover
        (drivers listen: :meth:`~sdk.sync.bamboo_p2p.driver.BambooConnection.wake`)."""


class StoreListeners:
    """The listener list the stores share (see :meth:`LogStore.add_listener`)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """See :meth:`LogStore.add_listener`."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback)

    def _stored(self) -> None:
        for callback in self._listeners:
            callback()


def append_entry(
    store: LogStore, key: KeyPair, log_id: int, payload: bytes, *, end_of_log: bool = False
) -> Entry:
    """Sign the next entry of ``key``'s log ``log_id`` and put it and its payload in ``store``.

    The store must hold the entries it links to (``seq - 1`` and ``lipmaa(seq)``).
    """
    log: LogKey = (key.public_key, log_id)
    seq = store.latest(log) + 1
    links = _links(store, log, seq)
    if links is None:
        raise ValueError(f"entry {seq} needs entries {seq - 1} and {lipmaa(seq)}")
    entry = sign_log_entry(key, log_id, seq, payload, *links, end_of_log=end_of_log)
    store.put_entry(entry)
    store.put_payload(log, seq, payload)
    return entry


def _links(
    store: LogStore, log: LogKey, seq_num: int, backlink: bytes | None = None
) -> tuple[bytes | None, bytes | None] | None:
    """The backlink (unless given) and lipmaa link of entry ``seq_num``: the hashes of
    the stored entries they point to (``None`` when one of those is not stored)."""
    if seq_num == 1:
        return backlink, None
    if backlink is None:
        previous = store.entry(log, seq_num - 1)
        if previous is None:
            return None
        backlink = previous.hash
    target = lipmaa(seq_num)
    if target == seq_num - 1:
        return backlink, None
    anchor = store.entry(log, target)
    return None if anchor is None else (backlink, anchor.hash)


def resume_offset(store: LogStore, log: LogKey, seq_num: int) -> int | None:
    """Where a proposal with a starting offset resumes payload ``seq_num``: the length of
    the prefix the store kept of it, or ``None`` when there is nothing to resume (no
    prefix kept, the payload is already stored, or the store lacks the entry)."""
    if store.entry(log, seq_num) is None or store.payload(log, seq_num) is not None:
        return None
    kept = store.partial_payload(log, seq_num)
    return None if kept is None else len(kept)


@dataclass(slots=True)
class _Log:
    entries: dict[int, Entry] = field(default_factory=dict)
    payloads: dict[int, bytes] = field(default_factory=dict)
    partials: dict[int, bytes] = field(default_factory=dict)
    end: int | None = None
    fork: tuple[Entry, Entry] | None = None
    latest: int = 0


#: What an unknown log reads as (never written to).
_NO_LOG = _Log()


class MemoryLogStore(StoreListeners):
    """A :class:`LogStore` in dictionaries, with helpers to write one's own logs."""

    def __init__(self) -> None:
        super().__init__()
        self._logs: defaultdict[LogKey, _Log] = defaultdict(_Log)

    def entry(self, log: LogKey, seq_num: int) -> Entry | None:
        """The stored entry, if any."""
        return self._logs.get(log, _NO_LOG).entries.get(seq_num)

    def payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The stored payload, if any."""
        return self._logs.get(log, _NO_LOG).payloads.get(seq_num)

    def put_entry(self, entry: Entry) -> None:
        """Store a verified entry."""
        log = self._logs[entry.author, entry.log_id]
        log.entries[entry.seq_num] = entry
        log.latest = max(log.latest, entry.seq_num)
        if is_end_of_log(entry):
            log.end = entry.seq_num
        self._stored()

    def put_payload(self, log: LogKey, seq_num: int, payload: bytes) -> None:
        """Store a verified payload."""
        found = self._logs[log]
        found.payloads[seq_num] = payload
        found.partials.pop(seq_num, None)
        self._stored()

    def partial_payload(self, log: LogKey, seq_num: int) -> bytes | None:
        """The kept prefix of a cut payload, if any."""
        return self._logs.get(log, _NO_LOG).partials.get(seq_num)

    def put_partial_payload(self, log: LogKey, seq_num: int, prefix: bytes | None) -> None:
        """Keep (or with ``None`` forget) the prefix of a cut payload."""
        partials = self._logs[log].partials
        if prefix is None:
            partials.pop(seq_num, None)
        else:
            partials[seq_num] = prefix

    def end_of_log(self, log: LogKey) -> int | None:
        """The end-of-log sequence number, if known."""
        return self._logs.get(log, _NO_LOG).end

    def fork_proof(self, log: LogKey) -> tuple[Entry, Entry] | None:
        """The fork proof of ``log``, if known."""
        return self._logs.get(log, _NO_LOG).fork

    def record_fork(self, log: LogKey, proof: tuple[Entry, Entry]) -> None:
        """Remember a fork proof (the first one is kept)."""
        found = self._logs[log]
        if found.fork is None:
            found.fork = proof

    def flush(self) -> None:
        """Nothing to do: a store in memory is as durable as it gets."""

    # --------------------------------------------------------- own logs, tests

    def sequence_numbers(self, log: LogKey) -> list[int]:
        """The stored sequence numbers of ``log``, ascending."""
        return sorted(self._logs.get(log, _NO_LOG).entries)

    def payload_sequence_numbers(self, log: LogKey) -> list[int]:
        """The sequence numbers whose payload is stored, ascending."""
        return sorted(self._logs.get(log, _NO_LOG).payloads)

    def latest(self, log: LogKey) -> int:
        """The highest stored sequence number of ``log`` (0 if none)."""
        return self._logs.get(log, _NO_LOG).latest

    def append(
        self, key: KeyPair, log_id: int, payload: bytes, *, end_of_log: bool = False
    ) -> Entry:
        """Sign and store the next entry of one's own log ``log_id`` (needs its links)."""
        return append_entry(self, key, log_id, payload, end_of_log=end_of_log)

    def copy_entries(self, other: MemoryLogStore, log: LogKey, seqs: list[int]) -> None:
        """Copy entries (and payloads) ``seqs`` of ``log`` from ``other`` (test set-up)."""
        for seq in seqs:
            entry = other.entry(log, seq)
            if entry is None:
                raise ValueError(f"{seq} is not in the other store")
            self.put_entry(entry)
            payload = other.payload(log, seq)
            if payload is not None:
                self.put_payload(log, seq, payload)


def _verify_fork_proof(log: LogKey, proof: tuple[Entry, Entry]) -> bool:
    """Whether two entries prove ``log`` forked: both signed by its author and in it,
    and either different entries at one sequence number, or the later one links to a
    hash that is not the earlier one's at the linked sequence number."""
    a, b = sorted(proof, key=lambda e: e.seq_num)
    if not (a.author, a.log_id) == (b.author, b.log_id) == log:
        return False
    try:
        a.verify_signature()
        b.verify_signature()
    except DocumentError:
        return False
    if a.seq_num == b.seq_num:
        return a.hash != b.hash
    # A link that is there (None: not encoded) and names another entry.
    if b.seq_num - 1 == a.seq_num and b.backlink not in (None, a.hash):
        return True
    return b.seq_num > 1 and lipmaa(b.seq_num) == a.seq_num and b.lipmaa_link not in (None, a.hash)


def carry_out(store: LogStore, request: StoreRead | Write) -> Snapshot | list[Written]:
    """Carry out one request of :class:`~sdk.sync.bamboo_p2p.machine.BambooMachine` on
    ``store`` (the store-side half of the protocol: reads, signature and hash checks,
    writes); the driver runs it off the event loop and hands the result back."""
    if isinstance(request, StoreRead):
        return _read(store, request)
    out: list[Written] = []
    forked: set[int] = set()
    invalid = False
    for item in request.items:
        if isinstance(item, ReceivedEntry | ReceivedPayload):
            if invalid or item.request_id in forked:
                out.append(Written(Outcome.SKIPPED))
                continue
            done = _entry(store, item) if isinstance(item, ReceivedEntry) else _payload(store, item)
            invalid = done.outcome is Outcome.INVALID
            if done.outcome is Outcome.FORK:
                forked.add(item.request_id)
            out.append(done)
        elif isinstance(item, KeepPartial):
            _keep_partial(store, item)
            out.append(Written(Outcome.KNOWN))
        else:
            verified = _verify_fork_proof(item.log, item.proof)
            if verified:
                store.record_fork(item.log, item.proof)
            out.append(Written(Outcome.KNOWN, verified=verified))
    store.flush()
    return out


def _read(store: LogStore, read: StoreRead) -> Snapshot:
    log = read.log
    entries = {seq_num: store.entry(log, seq_num) for seq_num in read.entries}
    payloads: dict[int, bytes | None] = {}
    spent = 0
    for seq_num, with_payload in read.ahead:
        if seq_num not in entries:
            entries[seq_num] = store.entry(log, seq_num)
        if entries[seq_num] is None:
            break
        if not with_payload:
            continue
        if payloads and spent >= read.budget:
            break
        payload = payloads[seq_num] = store.payload(log, seq_num)
        spent += 0 if payload is None else len(payload)
    fork = store.fork_proof(log) if read.fork else None
    return Snapshot(entries, payloads, store.end_of_log(log), fork)


def _entry(store: LogStore, item: ReceivedEntry) -> Written:
    """Rebuild the entry (the lipmaa link and, unless transmitted, the backlink come
    from stored entries), check it, and store it unless another holds its place."""
    log, seq_num, m = item.log, item.seq_num, item.message
    links = _links(store, log, seq_num, m.backlink)
    if links is None:
        return Written(Outcome.UNVERIFIABLE)
    entry = build_entry(
        log[0], log[1], seq_num, *links, m.payload_size, m.payload_hash, m.signature, m.tag
    )
    try:
        entry.verify_signature()
    except DocumentError as exc:
        return Written(Outcome.INVALID, detail=f"metadata of entry {seq_num}: {exc}")
    end = store.end_of_log(log)
    if end is not None and seq_num > end:
        detail = f"metadata of entry {seq_num}: entry {seq_num} after the end-of-log entry {end}"
        return Written(Outcome.INVALID, detail=detail)
    existing = store.entry(log, seq_num)
    fork: tuple[Entry, Entry] | None = None
    if existing is not None and existing.hash != entry.hash:
        fork = (existing, entry)
    elif m.backlink is not None:
        previous = store.entry(log, seq_num - 1)
        if previous is not None and previous.hash != m.backlink:
            fork = (previous, entry)
    if fork is not None:
        store.record_fork(log, fork)
        return Written(Outcome.FORK, proof=fork)
    if existing is not None:
        return Written(Outcome.KNOWN, entry)
    store.put_entry(entry)
    return Written(Outcome.STORED, entry)


def _payload(store: LogStore, item: ReceivedPayload) -> Written:
    log, seq_num = item.log, item.seq_num
    payload = _after_kept(store, item)
    if payload is None:
        return Written(Outcome.UNCHECKED)  # the rest alone cannot be checked
    if yasmf_hash(payload) != item.payload_hash:
        if item.base:
            # The kept prefix may be what was wrong (an earlier peer sent it): forget
            # it, and do not blame this peer.
            store.put_partial_payload(log, seq_num, None)
            return Written(Outcome.UNCHECKED)
        return Written(
            Outcome.INVALID, detail=f"payload of entry {seq_num} does not match its hash"
        )
    entry = store.entry(log, seq_num)
    if (
        entry is None
        or entry.payload_hash != item.payload_hash
        or store.payload(log, seq_num) is not None
    ):
        return Written(Outcome.KNOWN)
    store.put_payload(log, seq_num, payload)
    return Written(Outcome.STORED)


def _after_kept(store: LogStore, item: ReceivedPayload | KeepPartial) -> bytes | None:
    """The item's bytes after the first ``base`` of the kept prefix (``None``: not kept)."""
    if not item.base:
        return item.data
    kept = store.partial_payload(item.log, item.seq_num)
    return None if kept is None or len(kept) < item.base else kept[: item.base] + item.data


def _keep_partial(store: LogStore, item: KeepPartial) -> None:
    log, seq_num = item.log, item.seq_num
    if store.payload(log, seq_num) is not None:
        return
    prefix = _after_kept(store, item)
    kept = store.partial_payload(log, seq_num)
    if prefix is not None and (kept is None or len(kept) < len(prefix)):
        store.put_partial_payload(log, seq_num, prefix)


__all__ = [
    "LogKey",
    "LogStore",
    "MemoryLogStore",
    "StoreListeners",
    "append_entry",
    "carry_out",
    "resume_offset",
]
