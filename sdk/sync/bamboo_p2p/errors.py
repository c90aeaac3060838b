"""The exception classes of Bamboo point-to-point, a branch of the sync layer's tree.

The whole tree is drawn in :mod:`sdk.sync.errors`; this package's part of it::

    SyncError
     ├── LocalProtocolError            the caller misused the endpoint (also a ValueError)
     └── RemoteProtocolError           the peer broke the protocol; the connection is dropped
          ├── MalformedMessage         bytes that do not decode (truncated, unused first byte,
          │                            bad VarU64 or hash, trailing bytes)
          └── BambooP2PError           a rule of this protocol; ``rule`` names it
               ├── FramingError        the framing below the two channels (channel id, size)
               ├── CreditViolation     a proposal without credit, or credit above 2^64 - 1
               ├── RequestIdViolation  an id of the wrong parity, or one that is still in use
               ├── UnknownRequest      adjust, cancel, switch or data for an inactive request
               ├── RangeViolation      end < start, upper < end, lower > start, seq number 0,
               │                       data past the end of the request
               ├── AdjustmentViolation confirmation without eagerness, min down or max up,
               │                       anything after cancelling
               ├── DataOrderViolation  data before a switch, after a cancellation marker,
               │                       metadata where a payload is due or the other way round
               ├── EagernessViolation  data where notifications were asked for, or the reverse
               ├── SkipViolation       skips the metadata disproves, skipping mandatory
               │                       payloads, skipping more payload bytes than transmitted
               ├── PayloadSizeViolation more payload bytes than the metadata says
               ├── CompressionViolation compressed data although the window is 0
               ├── ApologyViolation    an apology for valid data, for nothing, or too late
               └── InvalidData         data that does not verify (signature, links, payload
                                       hash, log rules) where the mode does not allow it

:class:`LocalProtocolError`, :class:`RemoteProtocolError` and :class:`MalformedMessage`
are the shared classes of :mod:`sdk.sync.errors`, re-exported here. Every decoder of peer
bytes raises only :class:`RemoteProtocolError` subclasses on any input; any other
exception is a bug. The endpoint turns each of them into a dropped connection
(``Endpoint.closed`` holds the error), as the spec's "Invariants, drop connection if
violated" asks.
"""

from __future__ import annotations

from sdk.sync.errors import LocalProtocolError, MalformedMessage, RemoteProtocolError


class BambooP2PError(RemoteProtocolError):
    """The peer broke a rule of Bamboo point-to-point (``rule`` names it)."""

    rule = "bamboo_p2p"


class FramingError(BambooP2PError):
    """The framing that carries the control and data channels is broken."""

    rule = "framing"


class CreditViolation(BambooP2PError):
    """A proposal the peer had no credit for, or outstanding credit above 2^64 - 1."""

    rule = "credit"


class RequestIdViolation(BambooP2PError):
    """A proposal id of the other endpoint's parity, or one that is still in use."""

    rule = "request_id"


class UnknownRequest(BambooP2PError):
    """A message names a request that is not active."""

    rule = "unknown_request"


class RangeViolation(BambooP2PError):
    """Sequence numbers out of order, zero, or data past the end of a request."""

    rule = "range"


class AdjustmentViolation(BambooP2PError):
    """An adjustment the rules forbid (see the control channel invariants)."""

    rule = "adjustment"


class DataOrderViolation(BambooP2PError):
    """A data-channel message at a time the data channel does not allow it."""

    rule = "data_order"


class EagernessViolation(BambooP2PError):
    """Data sent where notifications were asked for, or notifications where data was."""

    rule = "eagerness"


class SkipViolation(BambooP2PError):
    """A skip the metadata or the request does not allow."""

    rule = "skip"


class PayloadSizeViolation(BambooP2PError):
    """Payload bytes beyond the size the metadata declares, or outside the asked sizes."""

    rule = "payload_size"


class CompressionViolation(BambooP2PError):
    """Compressed payload although the negotiated compression window is 0."""

    rule = "compression"


class ApologyViolation(BambooP2PError):
    """An apology for valid data, a second one, or invalid data not apologised for."""

    rule = "apology"


class InvalidData(BambooP2PError):
    """Metadata or a payload that does not verify where the receive mode forbids it."""

    rule = "invalid_data"


__all__ = [
    "AdjustmentViolation",
    "ApologyViolation",
    "BambooP2PError",
    "CompressionViolation",
    "CreditViolation",
    "DataOrderViolation",
    "EagernessViolation",
    "FramingError",
    "InvalidData",
    "LocalProtocolError",
    "MalformedMessage",
    "PayloadSizeViolation",
    "RangeViolation",
    "RemoteProtocolError",
    "RequestIdViolation",
    "SkipViolation",
    "UnknownRequest",
]
