"""The SDS core's exception tree.

::

    SDSError
     ├── LocalProtocolError   the caller misused the API (also a ValueError)
     │    └── MessageTooLarge the encoded message is over the size limit
     └── RemoteProtocolError  a peer sent something invalid; ``reason`` names the rule

A peer's bad input never escapes :meth:`MessageChannel.receive` as an
exception: it becomes a :class:`~sdk.sds.events.MessageRejected` event and a
counter. ``RemoteProtocolError`` is what the decoder raises for callers that
decode bytes themselves. Any other exception is a bug.
"""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    """Why a message from the wire was rejected (the counter key in ``stats``)."""

    DECODE = "decode"
    TOO_LARGE = "too_large"
    FIELD_TOO_LONG = "field_too_long"
    HISTORY_TOO_LONG = "history_too_long"
    REPAIR_REQUEST_TOO_LONG = "repair_request_too_long"
    FILTER_TOO_LARGE = "filter_too_large"
    INVALID_KIND = "invalid_kind"
    MISSING_ID = "missing_id"
    MESSAGE_ID_MISMATCH = "message_id_mismatch"
    #: A Lamport time at or beyond 2**63. Times merely far ahead are accepted
    #: (our clock follows them only up to ``max_lamport_drift_ms``).
    LAMPORT_DRIFT = "lamport_drift"
    #: The message names another channel than the one it was given to.
    FOREIGN_CHANNEL = "foreign_channel"
    INCOMING_BUFFER_FULL = "incoming_buffer_full"


class SDSError(Exception):
    """Base class of every error the SDS core raises."""


class LocalProtocolError(SDSError, ValueError):
    """The caller used the API wrongly (bad argument, closed channel, ...)."""


class MessageTooLarge(LocalProtocolError):
    """What :meth:`MessageChannel.send` would broadcast is over the limit
    (``limits.max_message_size``, or the caller's ``max_size``: the transport's);
    nothing was sent, logged or buffered."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"encoded message is {size} bytes, over the limit of {limit} "
            "(limits.max_message_size, or the transport's max_size); send smaller content"
        )
        self.size = size
        self.limit = limit


class RemoteProtocolError(SDSError):
    """Bytes from a peer violate the wire format or a configured bound."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
