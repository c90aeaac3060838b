"""The default ``Encryption`` handle of a channel: seal what SDS wrote, open what peers sent.

:class:`ChannelEncryption` is what ``Node.join(..., encryption=...)`` takes
(any object with ``encrypt``/``decrypt`` does). Sending, it signs the SDS
message as this member and seals it under the ring's newest epoch; receiving,
it opens the envelope under the epoch it names, checks the signature against
that epoch's roster and that the SDS ``sender_id`` inside is the signer's.

It remembers the envelope each SDS message travelled in (bounded), so that
sealing those bytes again returns the same envelope. That is what lets SDS-R
repair work sealed: a participant rebroadcasting *another* member's message
cannot sign it as that member, so it sends the original envelope unchanged; and
our own resends keep one transport hash, so a store deduplicates them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sdk.encryption._wire import channel_bytes
from sdk.encryption.envelope import OVERHEAD, open_sealed, read_header, seal
from sdk.encryption.errors import (
    EncryptionUsageError,
    MalformedPlaintext,
    SenderMismatch,
    UnknownEpoch,
)
from sdk.encryption.keys import Epoch, Identity
from sdk.encryption.ring import KeyRing
from sdk.sds.errors import RemoteProtocolError
from sdk.sds.limits import DEFAULT_LIMITS, Limits
from sdk.sds.message import decode_archive_fields


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class ChannelEncryption:
    """Seal and open one channel's messages as member ``sender_id``.

    ``ring`` holds the channel's epochs (it may grow while in use: a rotation is
    ``ring.accept(package, identity)``, and the next message is sealed under the
    new epoch). ``identity`` must be the key the roster lists for ``sender_id``.
    ``clock`` gives the envelope's timestamp (epoch ms). ``limits`` are the SDS
    channel's (the sealed message's ``sender_id`` is decoded with them);
    envelopes over ``max_envelope_size`` (default: the SDS message bound plus
    :attr:`overhead`) are refused unopened. ``cache_size`` envelopes are
    remembered for resends and repair (module docstring).
    """

    #: Bytes an envelope adds to an SDS message (the runtime lowers its payload limit by it).
    overhead = OVERHEAD
    #: Sealing the same bytes again gives the same envelope (while remembered): the
    #: runtime then logs a sent message with its envelope's hash from the start.
    stable_envelopes = True

    def __init__(
        self,
        ring: KeyRing,
        sender_id: str,
        identity: Identity,
        *,
        clock: Callable[[], int] | None = None,
        limits: Limits = DEFAULT_LIMITS,
        max_envelope_size: int | None = None,
        cache_size: int = 4_096,
    ) -> None:
        if cache_size < 0:
            raise EncryptionUsageError("cache_size must be >= 0")
        self.ring = ring
        self.sender_id = sender_id
        self.identity = identity
        self._clock = clock or _wall_clock_ms
        self._limits = limits
        self.max_envelope_size = max_envelope_size or limits.max_message_size + OVERHEAD
        self._binding = channel_bytes(ring.channel_id)
        self._cache_size = cache_size
        #: SDS bytes -> (epoch number, envelope, whether we sealed it), oldest first.
        self._envelopes: dict[bytes, tuple[int, bytes, bool]] = {}
        self._signer: tuple[int, int] | None = None  # (epoch number, our index)

    @property
    def channel_id(self) -> str:
        """The channel this handle seals for."""
        return self.ring.channel_id

    def encrypt(self, clear_payload: bytes) -> bytes:
        """Seal an SDS message (the Reliable Channel API's ``encrypt``).

        Bytes sealed or opened recently come back as the same envelope (see the
        module docstring), except our own sealed under an epoch since replaced.
        Raises :class:`EncryptionUsageError` when this member is not in the newest
        epoch's roster with this identity (it was removed: it must not send).
        """
        epoch = self.ring.current
        cached = self._envelopes.get(clear_payload)
        if cached is not None and (cached[0] == epoch.number or not cached[2]):
            return cached[1]
        envelope = seal(
            self._binding,
            epoch,
            self._index_in(epoch),
            self.identity,
            clear_payload,
            self._clock(),
        )
        self._remember(clear_payload, epoch.number, envelope, own=True)
        return envelope

    def decrypt(self, encrypted_payload: bytes) -> bytes:
        """Open an envelope and return the SDS message (the API's ``decrypt``).

        Raises a :class:`~sdk.encryption.RemoteEncryptionError` subclass for
        anything but an envelope of this channel, sealed under an epoch held,
        signed by the roster member whose ``sender_id`` the SDS message carries.
        """
        data = encrypted_payload
        header = read_header(data, self.max_envelope_size)
        epoch = self.ring.get(header.epoch)
        if epoch is None:
            raise UnknownEpoch(header.epoch)
        signer, sds = open_sealed(self._binding, epoch, data)
        try:
            claimed = decode_archive_fields(sds, self._limits)[0]
        except RemoteProtocolError as exc:
            raise MalformedPlaintext(f"sealed content is not an SDS message: {exc}") from None
        if claimed != signer:
            raise SenderMismatch(f"signed by {signer!r}, claims sender_id {claimed[:64]!r}")
        self._remember(sds, epoch.number, bytes(data), own=False)
        return sds

    def _index_in(self, epoch: Epoch) -> int:
        signer = self._signer
        if signer is not None and signer[0] == epoch.number:
            return signer[1]
        index = epoch.index_of(self.sender_id)
        if index is None:
            raise EncryptionUsageError(
                f"{self.sender_id!r} is not a member of epoch {epoch.number} of "
                f"{self.channel_id!r}: it cannot send"
            )
        if epoch.roster[index][1] != self.identity.signing_public:
            raise EncryptionUsageError(
                f"epoch {epoch.number} lists another signing key for {self.sender_id!r}"
            )
        self._signer = (epoch.number, index)
        return index

    def _remember(self, sds: bytes, epoch: int, envelope: bytes, *, own: bool) -> None:
        if self._cache_size == 0:
            return
        cache = self._envelopes
        if sds in cache:
            if not own:
                return  # a copy of what we hold: keep the first envelope
            del cache[sds]
        cache[sds] = (epoch, envelope, own)
        if len(cache) > self._cache_size:
            del cache[next(iter(cache))]
