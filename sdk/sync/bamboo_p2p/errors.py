"""The exception classes of Bamboo point-to-point, a branch of the tree drawn in
:mod:`sdk.sync.errors` (whose shared classes are re-exported here).

:class:`BambooP2PError` is the base of one class per rule of this protocol (each
class's docstring says which invariants it covers). A decoder of peer bytes raises
only :class:`RemoteProtocolError` subclasses; the endpoint turns each into a dropped
connection (``Endpoint.error`` holds it), as the spec's "Invariants, drop connection
if violated" asks.
"""

from __future__ import annotations

from sdk.sync.errors import LocalProtocolError, MalformedMessage, RemoteProtocolError


class BambooP2PError(RemoteProtocolError, rule="bamboo_p2p"):
    """The peer broke a rule of Bamboo point-to-point (``rule`` names it)."""


class FramingError(BambooP2PError, rule="framing"):
    """The framing that carries the control and data channels is broken."""


class CreditViolation(BambooP2PError, rule="credit"):
    """A proposal the peer had no credit for, or outstanding credit above 2^64 - 1."""


class RequestIdViolation(BambooP2PError, rule="request_id"):
    """A proposal id of the other endpoint's parity, or one that is still in use."""


class UnknownRequest(BambooP2PError, rule="unknown_request"):
    """Adjust, cancel, switch or data for a request that is not active."""


class RangeViolation(BambooP2PError, rule="range"):
    """Sequence numbers out of order, zero, or data past the end of a request."""


class AdjustmentViolation(BambooP2PError, rule="adjustment"):
    """A confirmation without eagerness, a minimum down or maximum up, anything after
    cancelling (the control channel invariants)."""


class DataOrderViolation(BambooP2PError, rule="data_order"):
    """Data before a switch or after a cancellation marker, metadata where a payload is
    due or the other way round."""


class EagernessViolation(BambooP2PError, rule="eagerness"):
    """Data sent where notifications were asked for, or notifications where data was."""


class SkipViolation(BambooP2PError, rule="skip"):
    """A skip the metadata disproves, a skipped mandatory payload, or more payload bytes
    skipped than were transmitted."""


class PayloadSizeViolation(BambooP2PError, rule="payload_size"):
    """Payload bytes beyond the size the metadata declares, or outside the asked sizes."""


class CompressionViolation(BambooP2PError, rule="compression"):
    """Compressed payload although the negotiated compression window is 0."""


class ApologyViolation(BambooP2PError, rule="apology"):
    """An apology for valid data, a second one, or invalid data not apologised for."""


class InvalidData(BambooP2PError, rule="invalid_data"):
    """Metadata or a payload that does not verify (signature, links, payload hash, log
    rules) where the receive mode forbids it."""


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
