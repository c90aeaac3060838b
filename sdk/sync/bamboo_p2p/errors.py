"""The exception classes of Bamboo point-to-point, a branch of the sync layer's tree.

The whole tree is drawn in :mod:`sdk.sync.errors`: :class:`BambooP2PError` (a
:class:`RemoteProtocolError`) is the base of one class per rule of this protocol
(each class's docstring says which invariants it covers), beside the shared
:class:`LocalProtocolError` (the caller misused the endpoint), :class:`RemoteProtocolError`
and :class:`MalformedMessage` (bytes that do not decode), re-exported here. Every
decoder of peer bytes raises only :class:`RemoteProtocolError` subclasses on any
input; any other exception is a bug. The endpoint turns each of them into a dropped
connection (``Endpoint.closed`` holds the error), as the spec's "Invariants, drop
connection if violated" asks.
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
    """Adjust, cancel, switch or data for a request that is not active."""

    rule = "unknown_request"


class RangeViolation(BambooP2PError):
    """Sequence numbers out of order, zero, or data past the end of a request."""

    rule = "range"


class AdjustmentViolation(BambooP2PError):
    """A confirmation without eagerness, a minimum down or maximum up, anything after
    cancelling (the control channel invariants)."""

    rule = "adjustment"


class DataOrderViolation(BambooP2PError):
    """Data before a switch or after a cancellation marker, metadata where a payload is
    due or the other way round."""

    rule = "data_order"


class EagernessViolation(BambooP2PError):
    """Data sent where notifications were asked for, or notifications where data was."""

    rule = "eagerness"


class SkipViolation(BambooP2PError):
    """A skip the metadata disproves, a skipped mandatory payload, or more payload bytes
    skipped than were transmitted."""

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
    """Metadata or a payload that does not verify (signature, links, payload hash, log
    rules) where the receive mode forbids it."""

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
