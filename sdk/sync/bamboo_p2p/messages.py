"""The messages of the control and the data channel, as frozen dataclasses.

Names follow the spec (``specs/bamboo-point-2-point.md``, "Encodings"): the spec
calls proposals "requests" in its encoding section and uses *request number* and
*synchronization id* for the same thing; here it is ``request_id`` throughout.
Byte layouts live in :mod:`.codec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from sdk.documents.bamboo import Entry
from sdk.documents.varu64 import MAX_U64


class EagerMode(IntEnum):
    """How much the sending endpoint of a proposal/adjustment wants transmitted; the
    values are the first byte's two eagerness bits (2nd and 3rd)."""

    NOTIFY = 0b01
    UP_TO = 0b10
    ALL = 0b11


@dataclass(frozen=True, slots=True)
class Eagerness:
    """An eagerness setting; ``payload_limit`` only with :attr:`EagerMode.UP_TO`: send all
    metadata, and payloads of at most ``payload_limit`` bytes (larger ones only notified)."""

    mode: EagerMode
    payload_limit: int = 0

    def wants_metadata(self) -> bool:
        """Whether metadata should be transmitted rather than notified."""
        return self.mode is not EagerMode.NOTIFY

    def wants_payload(self, size: int) -> bool:
        """Whether a payload of ``size`` bytes should be transmitted rather than notified."""
        mode = self.mode
        return mode is EagerMode.ALL or (mode is EagerMode.UP_TO and size <= self.payload_limit)


NOTIFY = Eagerness(EagerMode.NOTIFY)
ALL = Eagerness(EagerMode.ALL)


class CancelReason(IntEnum):
    """Why a proposal is cancelled: the first byte of the cancellation (128-135)."""

    DO_NOT_RETRY = 128
    RESOURCE_LIMIT = 129
    END_OF_RANGE = 130
    CONFIRM = 131
    MANDATORY_PAYLOAD = 132
    HASH_MISMATCH = 133
    END_OF_LOG = 134
    FORKED = 135

    @property
    def meaning(self) -> str:
        """What the code says, in words (the spec's list of cancel bytes, with what
        Chorus sends it for); ``docs/bamboo-p2p.md`` has the same table."""
        return _CANCEL_MEANINGS[self]


_CANCEL_MEANINGS = {
    CancelReason.DO_NOT_RETRY: (
        "do not retry: this pair cannot complete the request (Chorus sends it when a finite "
        "request made no progress for its stall timeout, and for an open-ended sparse or "
        "payload-only proposal)"
    ),
    CancelReason.RESOURCE_LIMIT: "resource limit: cancel another request and try again",
    CancelReason.END_OF_RANGE: "end of the range: everything in the finite range was synced",
    CancelReason.CONFIRM: (
        "confirming the other side's cancellation: we cancelled first (after reaching the "
        "end of the range, or after giving up)"
    ),
    CancelReason.MANDATORY_PAYLOAD: (
        "the other side will not wait for a mandatory payload it lacks"
    ),
    CancelReason.HASH_MISMATCH: (
        "the expected starting hash does not match the other side's entry: its log differs"
    ),
    CancelReason.END_OF_LOG: "the log has an end-of-log entry before the range starts",
    CancelReason.FORKED: "the log is forked before the range starts (fork proof attached)",
}


# ---------------------------------------------------------------- control channel


@dataclass(frozen=True, slots=True)
class GrantCredit:
    """Byte 0: give the other endpoint ``amount`` more proposal credit."""

    amount: int


@dataclass(frozen=True, slots=True)
class Propose:
    """A synchronization proposal (first byte >= 160).

    ``lower_certpool`` is ``None`` exactly when ``offset`` is set (the range then
    starts inside the payload of ``start``). ``end``/``upper_certpool`` are both
    ``None`` for an infinite range. ``expected_hash`` is the hash of the entry at
    ``lipmaa(lower_certpool)`` (or of ``start`` with an offset), ``None`` when the
    lower certpool info is 1. ``min_payload``/``max_payload``/``eagerness``/
    ``mandatory`` are the proposing endpoint's own wishes.
    """

    request_id: int
    author: bytes
    log_id: int
    start: int
    lower_certpool: int | None
    min_payload: int
    max_payload: int
    expected_hash: bytes | None
    eagerness: Eagerness
    end: int | None = None
    upper_certpool: int | None = None
    offset: int | None = None
    payload_only: bool = False
    sparse: bool = False
    mandatory: bool = False


@dataclass(frozen=True, slots=True)
class Adjust:
    """An adjustment (first byte 1-127); the first one of the non-proposer confirms.

    Every field left ``None``/``False`` is not adjusted.
    """

    request_id: int
    eagerness: Eagerness | None = None
    allow_skip: bool = False
    end: int | None = None
    upper_certpool: int | None = None
    min_payload: int | None = None
    max_payload: int | None = None

    def is_empty(self) -> bool:
        """True when it adjusts nothing (such an adjustment has no encoding)."""
        return self == Adjust(self.request_id)


@dataclass(frozen=True, slots=True)
class Cancel:
    """A cancellation (first byte 128-135) of ``request_id``.

    Reason-specific data: ``entry`` for :attr:`CancelReason.HASH_MISMATCH` (the
    entry whose hash was not the expected one), ``seq_num`` for
    :attr:`CancelReason.END_OF_LOG`, ``entry`` and ``other_entry`` for
    :attr:`CancelReason.FORKED` (the fork proof).
    """

    request_id: int
    reason: CancelReason
    entry: Entry | None = None
    other_entry: Entry | None = None
    seq_num: int | None = None


ControlMessage = GrantCredit | Propose | Adjust | Cancel

# ------------------------------------------------------------------- data channel


@dataclass(frozen=True, slots=True)
class SwitchRequest:
    """Byte 0: the following data pertains to ``request_id``."""

    request_id: int


@dataclass(frozen=True, slots=True)
class Notify:
    """Byte 2 (``count`` 1) or byte 3: advance past ``count`` pieces without sending them."""

    count: int = 1


@dataclass(frozen=True, slots=True)
class SkipTooSmall:
    """Byte 4: skip one payload, smaller than the receiver's minimum."""


@dataclass(frozen=True, slots=True)
class SkipTooLarge:
    """Byte 5: skip one payload, larger than the receiver's maximum."""


@dataclass(frozen=True, slots=True)
class SkipUnavailable:
    """Byte 6: skip one payload the sender does not have (payloads not mandatory)."""


@dataclass(frozen=True, slots=True)
class SkipBytes:
    """Byte 7: advance ``count`` bytes inside a payload the receiver transmitted itself."""

    count: int


@dataclass(frozen=True, slots=True)
class PayloadChunk:
    """Byte 8: uncompressed payload bytes, the next ``len(data)`` of the current payload."""

    data: bytes


@dataclass(frozen=True, slots=True)
class CompressedPayload:
    """Byte 9: LZFoo-compressed payload bytes (only with a compression window > 0)."""

    uncompressed_length: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Apology:
    """Byte 16: the last piece sent was invalid; both cursors move back by one."""


@dataclass(frozen=True, slots=True)
class CancelMarker:
    """Byte 32: no more data for ``request_id`` follows on this data channel."""

    request_id: int


@dataclass(frozen=True, slots=True)
class Metadata:
    """Bytes 128 (tag 0) and 129 (tag 1): an entry's metadata.

    Author, log id and sequence number come from the request and the cursor, the
    lipmaa link from the entry it points to. ``backlink`` travels only when it is
    distinct from the lipmaa link and its target is not part of this request's data.
    """

    tag: int
    backlink: bytes | None
    payload_size: int
    payload_hash: bytes
    signature: bytes


DataMessage = (
    SwitchRequest
    | Notify
    | SkipTooSmall
    | SkipTooLarge
    | SkipUnavailable
    | SkipBytes
    | PayloadChunk
    | CompressedPayload
    | Apology
    | CancelMarker
    | Metadata
)

__all__ = [
    "ALL",
    "MAX_U64",
    "NOTIFY",
    "Adjust",
    "Apology",
    "Cancel",
    "CancelMarker",
    "CancelReason",
    "CompressedPayload",
    "ControlMessage",
    "DataMessage",
    "EagerMode",
    "Eagerness",
    "GrantCredit",
    "Metadata",
    "Notify",
    "PayloadChunk",
    "Propose",
    "SkipBytes",
    "SkipTooLarge",
    "SkipTooSmall",
    "SkipUnavailable",
    "SwitchRequest",
]
