"""The encryption hook at the byte boundary of a channel (Reliable Channel API ``Encryption``).

Whatever the scheme, the rule is the same and lives here: the SDS message is
sealed after the core encoded it and before the transport publishes it; a
received payload is opened before the core sees it, and one that does not open
becomes a :class:`DecryptionFailed` event (never an exception out of the
channel, never an entry in the log). :class:`SealedChannel` applies it to a
bare :class:`~sdk.sds.MessageChannel`; the asyncio runtime applies it in
``ReliableChannel`` (``Node.join(..., encryption=...)``).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sdk.encryption.errors import NotOurMessage, RemoteEncryptionError
from sdk.sds import events as sds_events
from sdk.sds.channel import Datagram, MessageChannel


@runtime_checkable
class Encryption(Protocol):
    """Handles for sealing and opening a channel's payloads (the API's ``Encryption``)."""

    def encrypt(self, clear_payload: bytes) -> bytes:
        """Seal an SDS-encoded message for publishing."""
        ...

    def decrypt(self, encrypted_payload: bytes) -> bytes:
        """Open a received payload to the SDS-encoded message; raise if it does not open."""
        ...


@dataclass(frozen=True, slots=True)
class DecryptionFailed(sds_events.Event):
    """A received payload did not open; it was dropped before reaching SDS.

    ``reason`` is the scheme's code (:attr:`~sdk.encryption.RemoteEncryptionError.reason`:
    ``unknown_epoch``, ``authentication``, ``forged_signature``, ...) or ``error``
    when a foreign handle raised something else; ``error`` its message; ``size``
    the payload's length; ``retrieval_hint`` the transport's hash of it, if known.
    """

    reason: str
    error: str
    size: int
    retrieval_hint: bytes | None = None


def open_payload(
    encryption: Encryption, channel_id: str, data: bytes, retrieval_hint: bytes | None
) -> bytes | DecryptionFailed:
    """The SDS bytes inside ``data``, or the event saying why there are none."""
    try:
        return encryption.decrypt(data)
    except Exception as exc:  # a foreign handle's failure is the peer's payload's, not ours
        return decryption_failed(channel_id, exc, data, retrieval_hint)


def decryption_failed(
    channel_id: str, error: Exception, data: bytes, retrieval_hint: bytes | None
) -> DecryptionFailed:
    """The event for ``data``, which did not open with ``error``: the scheme's reason
    for a :class:`~sdk.encryption.RemoteEncryptionError`, ``error`` for anything else."""
    if isinstance(error, RemoteEncryptionError):
        reason, detail = error.reason, str(error)
    else:
        reason, detail = "error", f"{type(error).__name__}: {error}"
    return DecryptionFailed(channel_id, reason, detail[:500], len(data), retrieval_hint)


def counter_names(event: DecryptionFailed) -> tuple[str, str]:
    """The counters a failure increments: ``decrypt_failed`` and ``decrypt_failed.<reason>``."""
    return "decrypt_failed", f"decrypt_failed.{event.reason}"


def sealed_hint(hash_of: Callable[[bytes], bytes], encryption: Encryption, data: bytes) -> bytes:
    """The retrieval hint ``data`` will have on the wire once sealed: ``hash_of`` the
    envelope. Right only for a handle whose ``stable_envelopes`` is true (sealing the
    same bytes again at publish gives the same envelope); if sealing fails here, the
    hint of the clear bytes (the publish then fails and says why)."""
    try:
        return hash_of(encryption.encrypt(data))
    except Exception:
        return hash_of(data)


def sealed_limit(limit: int | None, encryption: Encryption | None) -> int | None:
    """The SDS message size that still fits ``limit`` once sealed (``encryption.overhead``
    bytes added, when the handle says)."""
    if limit is None or encryption is None:
        return limit
    return limit - int(getattr(encryption, "overhead", 0))


class SealedChannel:
    """A :class:`~sdk.sds.MessageChannel` whose byte boundary is sealed.

    ``receive`` opens before the core decodes; ``datagrams_to_send`` seals what
    the core wrote; ``next_event`` yields :class:`DecryptionFailed` for payloads
    that did not open, then the core's events. Everything else is the core's
    (``sealed.core.send(...)``, ``handle_timer``, ``get_timer``, ...).
    ``stats`` counts failures to open and repairs left out (the core's own counters
    stay in ``core.stats``).
    """

    def __init__(self, core: MessageChannel, encryption: Encryption) -> None:
        #: The wrapped core (feed it sends and timers directly).
        self.core = core
        self.encryption = encryption
        #: ``decrypt_failed`` and ``decrypt_failed.<reason>``.
        self.stats: Counter[str] = Counter()
        self._failures: deque[DecryptionFailed] = deque()

    def receive(self, data: bytes, now: int, retrieval_hint: bytes | None = None) -> None:
        """Open ``data`` and give the SDS message to the core (decoded once, when the
        handle decodes it with the core's limits: ``decrypt_decoded``)."""
        core = self.core
        decrypt_decoded = getattr(self.encryption, "decrypt_decoded", None)
        if decrypt_decoded is not None and (
            getattr(self.encryption, "limits", None) == core.config.limits
        ):
            try:
                sds, message = decrypt_decoded(data)
            except Exception as exc:  # as open_payload: the peer's payload's failure
                self._failed(decryption_failed(core.channel_id, exc, data, retrieval_hint))
                return
            core.receive_message(message, sds, now, retrieval_hint)
            return
        opened = open_payload(self.encryption, core.channel_id, data, retrieval_hint)
        if isinstance(opened, DecryptionFailed):
            self._failed(opened)
            return
        core.receive(opened, now, retrieval_hint)

    def _failed(self, event: DecryptionFailed) -> None:
        self.stats.update(counter_names(event))
        self._failures.append(event)

    def datagrams_to_send(self) -> list[Datagram]:
        """The core's datagrams, sealed. A repair of another member's message whose
        envelope the handle no longer remembers is left out (counted as
        ``repair_unsealed``): sealed by us it would carry our signature, and members
        refuse it (``docs/encryption.md``, "One envelope per message")."""
        seal = self.encryption.encrypt
        out = []
        for d in self.core.datagrams_to_send():
            try:
                out.append(Datagram(d.channel_id, seal(d.data), d.message_id, d.kind))
            except NotOurMessage:
                self.stats["repair_unsealed"] += 1
        return out

    def next_event(self) -> sds_events.Event | None:
        """The next failure to open, else the core's next event."""
        if self._failures:
            return self._failures.popleft()
        return self.core.next_event()
