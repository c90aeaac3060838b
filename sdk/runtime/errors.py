"""The runtime's exception tree.

::

    ChorusRuntimeError
     ├── ChannelClosed       the channel or its node was closed
     ├── SendExpired         resent max_resends times without acknowledgement
     ├── SendFailed          the transport refused the message for good
     └── RuntimeFailure      a background task (persistence, publisher) failed

Misuse (bad arguments, unknown ids) raises :class:`~sdk.sds.LocalProtocolError`
(a ``ValueError``); transport errors during ``publish`` are surfaced as
:class:`~sdk.runtime.events.PublishFailed` events, never swallowed.
"""

from __future__ import annotations


class ChorusRuntimeError(Exception):
    """Base class of every error the runtime raises."""


class ChannelClosed(ChorusRuntimeError):
    """The channel (or the node running it) was closed."""


class SendExpired(ChorusRuntimeError):
    """A message was resent ``max_resends`` times and never acknowledged."""

    def __init__(self, message_id: str, attempts: int) -> None:
        super().__init__(f"message {message_id[:16]}... unacknowledged after {attempts} resends")
        self.message_id = message_id
        self.attempts = attempts


class SendFailed(ChorusRuntimeError):
    """The transport refused a message for good (e.g. it is over the payload limit)."""

    def __init__(self, message_id: str, error: str) -> None:
        super().__init__(f"message {message_id[:16]}... could not be sent: {error}")
        self.message_id = message_id
        self.error = error


class RuntimeFailure(ChorusRuntimeError):
    """A background task of the node failed; the node stops and this is its cause."""
