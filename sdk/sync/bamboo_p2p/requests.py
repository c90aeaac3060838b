"""What the Bamboo machine asks of its store, as data (:mod:`sdk.sync.machine`'s requests).

The machine (:class:`~sdk.sync.bamboo_p2p.machine.BambooMachine`) holds no store: it
asks with a :class:`StoreRead` or a :class:`Write`, and the answer comes back through
``request_done``. :func:`sdk.sync.bamboo_p2p.store.carry_out` answers both, on
whatever thread the driver chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sdk.documents.bamboo import Entry
from sdk.sync.bamboo_p2p.entries import LogKey
from sdk.sync.bamboo_p2p.messages import Metadata


@dataclass(slots=True)
class StoreRead:
    """Entries ``entries`` of ``log``, then the pieces ``ahead`` (sequence number, and
    whether the payload too); answered by a :class:`Snapshot`.

    The pieces ahead are read in order until an entry is absent, or the payload bytes
    reach ``budget`` (the first payload is always read); those after are left out of
    the answer (not read, unlike absent).
    """

    log: LogKey
    entries: list[int]
    ahead: list[tuple[int, bool]] = field(default_factory=list)
    budget: int = 1 << 62
    #: Also read the log's fork proof.
    fork: bool = False
    #: The machine's own: the request the read is for, and its store generation.
    request_id: int | None = None
    gen: int = 0


@dataclass(slots=True)
class Snapshot:
    """The answer to a :class:`StoreRead` (``None``: not in the store)."""

    entries: dict[int, Entry | None]
    payloads: dict[int, bytes | None]
    end_of_log: int | None
    fork_proof: tuple[Entry, Entry] | None = None


@dataclass(slots=True)
class ReceivedEntry:
    """Metadata the peer transmitted: rebuild, verify and store the entry."""

    request_id: int
    log: LogKey
    seq_num: int
    message: Metadata


@dataclass(slots=True)
class ReceivedPayload:
    """A payload the peer transmitted: check it against its hash and store it.

    ``data`` follows the first ``base`` bytes, which come from the prefix the store
    kept of a cut transfer (a payload whose bytes the peer skipped never gets here:
    nothing could be checked).
    """

    request_id: int
    log: LogKey
    seq_num: int
    size: int
    payload_hash: bytes
    data: bytes
    base: int


@dataclass(slots=True)
class KeepPartial:
    """Keep the received prefix of a payload whose transfer stopped (``base`` as in
    :class:`ReceivedPayload`), unless the payload or a longer prefix is stored."""

    log: LogKey
    seq_num: int
    data: bytes
    base: int


@dataclass(slots=True)
class ForkProof:
    """Two entries a peer sent as proof that ``log`` forked: verify, and record if valid."""

    log: LogKey
    proof: tuple[Entry, Entry]


Item = ReceivedEntry | ReceivedPayload | KeepPartial | ForkProof


class Outcome(Enum):
    """What became of one :class:`ReceivedEntry` or :class:`ReceivedPayload`."""

    STORED = "stored"
    #: Already stored (the same entry, or the payload).
    KNOWN = "known"
    #: An entry whose links the store cannot fill in.
    UNVERIFIABLE = "unverifiable"
    #: Does not verify (``detail`` says why).
    INVALID = "invalid"
    #: Another valid entry holds its place (``proof``).
    FORK = "fork"
    #: A resumed payload whose kept prefix was missing (nothing checked), or had to be
    #: forgotten because the whole did not match (nobody is blamed).
    UNCHECKED = "unchecked"
    #: After a fork of its request, or anything invalid, earlier in the same write.
    SKIPPED = "skipped"


@dataclass(slots=True)
class Written:
    """The answer to one item of a :class:`Write`."""

    outcome: Outcome
    entry: Entry | None = None
    detail: str = ""
    proof: tuple[Entry, Entry] | None = None
    #: For a :class:`ForkProof`: whether it verified.
    verified: bool = False


@dataclass(slots=True)
class Write:
    """Items in the order the peer sent them; answered by one :class:`Written` each.
    Once they are carried out the store is flushed."""

    items: list[Item]
    #: The machine's own bookkeeping, one per item.
    slots: list[Any] = field(default_factory=list)


__all__ = [
    "ForkProof",
    "Item",
    "KeepPartial",
    "Outcome",
    "ReceivedEntry",
    "ReceivedPayload",
    "Snapshot",
    "StoreRead",
    "Write",
    "Written",
]
