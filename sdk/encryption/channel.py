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
our own resends keep one transport hash, so a store deduplicates them. Another
member's message whose envelope it no longer remembers is refused
(:class:`~sdk.encryption.errors.NotOurMessage`), never sealed as ours: the runtime
keeps what rebuilds received envelopes on disk for that
(:meth:`ChannelEncryption.seal_record`, :meth:`ChannelEncryption.envelope_from`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from sdk.encryption._wire import channel_bytes
from sdk.encryption.envelope import (
    HEADER_SIZE,
    OVERHEAD,
    RECORD_SIZE,
    Opened,
    Opener,
    Sealer,
    open_verified,
    read_header,
    reseal,
    seal,
    seal_record,
)
from sdk.encryption.errors import (
    EncryptionUsageError,
    MalformedEnvelope,
    MalformedPlaintext,
    NotOurMessage,
    RemoteEncryptionError,
    SenderMismatch,
    UnknownEpoch,
)
from sdk.encryption.keys import Epoch, Identity
from sdk.encryption.ring import KeyRing
from sdk.sds.errors import RemoteProtocolError
from sdk.sds.limits import DEFAULT_LIMITS, Limits
from sdk.sds.message import Message, decode_archive_fields, decode_message
from sdk.sds.varint import encode_uvarint


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _compiled() -> tuple[Sealer, Opener] | None:
    """The compiled loop's sealer and opener, or ``None`` (PyNaCl's library from Python):
    looked up on first use, so importing this module does not load the document layer."""
    from sdk.documents.verifier import sealed_envelope_calls

    return sealed_envelope_calls()


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
        compiled = _compiled()
        self._sealer: Sealer | None = compiled[0] if compiled is not None else None
        self._opener: Opener | None = compiled[1] if compiled is not None else None
        self._cache_size = cache_size
        #: SDS bytes -> (epoch number, envelope, whether we sealed it, the signer and
        #: signature sealed in another member's envelope), oldest first. An OrderedDict:
        #: dropping the oldest of a full dict (``next(iter(d))``) walks the slots deleted
        #: before it, 2.4 us per message at 4,096 entries against 0.5 here.
        self._envelopes: OrderedDict[bytes, tuple[int, bytes, bool, bytes]] = OrderedDict()
        self._signer: tuple[int, int] | None = None  # (epoch number, our index)
        # How our SDS messages start (the encoder writes sender_id first): sealing
        # them needs no decoding to know they are ours.
        raw = sender_id.encode()
        self._own_prefix = b"\x0a" + encode_uvarint(len(raw)) + raw

    @property
    def channel_id(self) -> str:
        """The channel this handle seals for."""
        return self.ring.channel_id

    @property
    def limits(self) -> Limits:
        """The SDS limits opened messages are decoded with (:meth:`decrypt_decoded`)."""
        return self._limits

    def encrypt(self, clear_payload: bytes) -> bytes:
        """Seal an SDS message (the Reliable Channel API's ``encrypt``).

        Bytes sealed or opened recently come back as the same envelope (see the
        module docstring), except our own sealed under an epoch since replaced.
        Raises :class:`EncryptionUsageError` when this member is not in the newest
        epoch's roster with this identity (it was removed: it must not send), and its
        subclass :class:`~sdk.encryption.errors.NotOurMessage` for another member's
        message not remembered (a repair answered from disk: send the envelope it
        arrived in, :meth:`envelope_from` rebuilds it).
        """
        epoch = self.ring.current
        cached = self._envelopes.get(clear_payload)
        if cached is not None and (cached[0] == epoch.number or not cached[2]):
            return cached[1]
        if not clear_payload.startswith(self._own_prefix):
            self._refuse_foreign(clear_payload)
        envelope = seal(
            self._binding,
            epoch,
            self._index_in(epoch),
            self.identity,
            clear_payload,
            self._clock(),
            self._sealer,
        )
        self._remember(clear_payload, epoch.number, envelope, b"")
        return envelope

    def seal_record(self, sds: bytes) -> bytes | None:
        """What rebuilds the envelope another member's message ``sds`` arrived in, while
        remembered (``None`` for ours, or one forgotten): its header, signer and signature,
        103 bytes the runtime keeps on disk to answer an SDS-R repair of it later with the
        sender's signature (:meth:`envelope_from`)."""
        cached = self._envelopes.get(sds)
        if cached is None or cached[2]:
            return None
        # Kept when the envelope opened: no second AEAD open per received message.
        return seal_record(cached[1], cached[3])

    def envelope_from(self, sds: bytes, record: bytes) -> bytes:
        """The envelope :meth:`seal_record` gave ``record`` for, rebuilt byte for byte
        around ``sds`` (and remembered). Raises :class:`MalformedEnvelope` for a record of
        the wrong size, :class:`UnknownEpoch` when the ring no longer holds its epoch."""
        if len(record) != RECORD_SIZE:
            raise MalformedEnvelope(f"a seal record is {RECORD_SIZE} bytes, not {len(record)}")
        header = read_header(record, RECORD_SIZE)
        epoch = self.ring.get(header.epoch)
        if epoch is None:
            raise UnknownEpoch(header.epoch)
        envelope = reseal(self._binding, epoch, record, sds)
        self._remember(sds, epoch.number, envelope, record[HEADER_SIZE:])
        return envelope

    def _refuse_foreign(self, clear_payload: bytes) -> None:
        """Raise :class:`NotOurMessage` unless ``clear_payload`` is our SDS message."""
        try:
            sender, message_id = decode_archive_fields(clear_payload, self._limits)[:2]
        except RemoteProtocolError:
            return  # not SDS: ours to seal (the core only gives us its own encoding)
        if sender != self.sender_id:
            raise NotOurMessage(sender, message_id)

    def decrypt(self, encrypted_payload: bytes) -> bytes:
        """Open an envelope and return the SDS message (the API's ``decrypt``).

        Raises a :class:`~sdk.encryption.RemoteEncryptionError` subclass for
        anything but an envelope of this channel, sealed under an epoch held,
        signed by the roster member whose ``sender_id`` the SDS message carries.
        """
        return self.decrypt_decoded(encrypted_payload)[0]

    def decrypt_decoded(self, encrypted_payload: bytes) -> tuple[bytes, Message]:
        """:meth:`decrypt`, with the SDS message as decoded to check its ``sender_id``
        (:func:`~sdk.sds.message.decode_message` with :attr:`limits`): a core with the
        same limits takes it as is (``MessageChannel.receive_message``), without decoding
        the bytes a second time."""
        epoch = self._epoch_of(encrypted_payload)
        opened = open_verified(self._binding, [epoch], [encrypted_payload], self._opener)[0]
        if isinstance(opened, RemoteEncryptionError):
            raise opened
        return self._accept(epoch, opened, encrypted_payload)

    def open_batch(self, payloads: list[bytes]) -> SealedBatch:
        """Open several envelopes at once, seals and signature checks apart
        (``docs/encryption.md``, "Costs"): the headers are read here;
        :meth:`SealedBatch.check` opens every seal and verifies every signature in one
        call that may run on another thread; :meth:`SealedBatch.results` then gives, in
        order, what :meth:`decrypt` would return or raise for each payload.
        """
        epochs: list[Epoch | RemoteEncryptionError] = []
        for data in payloads:
            try:
                epochs.append(self._epoch_of(data))
            except RemoteEncryptionError as exc:
                epochs.append(exc)
        return SealedBatch(self, payloads, epochs)

    def _epoch_of(self, data: bytes) -> Epoch:
        """The epoch the envelope ``data`` names (its header checked), if the ring holds it."""
        header = read_header(data, self.max_envelope_size)
        epoch = self.ring.get(header.epoch)
        if epoch is None:
            raise UnknownEpoch(header.epoch)
        return epoch

    def _accept(self, epoch: Epoch, opened: Opened, data: bytes) -> tuple[bytes, Message]:
        """The SDS bytes of a verified envelope and their decoding, once its ``sender_id``
        is the signer's."""
        sds = opened.sds
        try:
            message = decode_message(sds, self._limits)
        except RemoteProtocolError as exc:
            raise MalformedPlaintext(f"sealed content is not an SDS message: {exc}") from None
        claimed = message.sender_id
        if claimed != opened.sender_id:
            raise SenderMismatch(
                f"signed by {opened.sender_id!r}, claims sender_id {claimed[:64]!r}"
            )
        self._remember(sds, epoch.number, bytes(data), opened.signer_and_signature)
        return sds, message

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

    def _remember(self, sds: bytes, epoch: int, envelope: bytes, sealed_by: bytes) -> None:
        """Remember ``envelope`` for ``sds``: ours when ``sealed_by`` is empty, else
        another member's, ``sealed_by`` its ``u16 signer || signature``."""
        if self._cache_size == 0:
            return
        cache = self._envelopes
        own = not sealed_by
        if sds in cache:
            if not own:
                return  # a copy of what we hold: keep the first envelope
            del cache[sds]
        cache[sds] = (epoch, envelope, own, sealed_by)
        if len(cache) > self._cache_size:
            cache.popitem(last=False)


class SealedBatch:
    """Envelopes whose headers are read and whose seals and signatures are to be
    opened and checked together (:meth:`ChannelEncryption.open_batch`).

    :meth:`check` touches nothing but the batch, so it may run on a worker thread
    while the event loop goes on; with the document layer's compiled loop it opens
    every seal and checks every signature in one call that releases the GIL once for
    the whole batch, so the work uses another core
    (:func:`sdk.encryption.envelope.open_verified`). Everything else, :meth:`results`
    included, runs on the handle's thread.
    """

    def __init__(
        self,
        handle: ChannelEncryption,
        payloads: list[bytes],
        epochs: list[Epoch | RemoteEncryptionError],
    ) -> None:
        self._handle = handle
        self._payloads = payloads
        self._epochs = epochs
        #: Per payload whose header was read, the envelope opened and verified (or the
        #: error that says why not), once :meth:`check` ran.
        self._opened: list[Opened | RemoteEncryptionError] | None = None

    def __len__(self) -> int:
        return len(self._payloads)

    def check(self) -> None:
        """Open every seal and verify every signature of the batch (thread-safe: reads
        only the batch, and the handle's channel binding and opener, set once)."""
        handle = self._handle
        readable = [
            (epoch, data)
            for epoch, data in zip(self._epochs, self._payloads, strict=True)
            if not isinstance(epoch, RemoteEncryptionError)
        ]
        self._opened = open_verified(
            handle._binding,
            [epoch for epoch, _ in readable],
            [data for _, data in readable],
            handle._opener,
        )

    def results(self) -> list[bytes | RemoteEncryptionError]:
        """Per payload, in order: its SDS bytes, or the error :meth:`~ChannelEncryption.decrypt`
        raises for it. If :meth:`check` did not run, it runs here first; a signature it
        refused is forged (its answer is libsodium's, the one ``decrypt`` asks)."""
        return [r if isinstance(r, RemoteEncryptionError) else r[0] for r in self.decoded()]

    def decoded(self) -> list[tuple[bytes, Message] | RemoteEncryptionError]:
        """:meth:`results`, each SDS message with its decoding
        (:meth:`ChannelEncryption.decrypt_decoded`)."""
        if self._opened is None:
            self.check()
        opened_all = self._opened
        assert opened_all is not None
        accept = self._handle._accept
        out: list[tuple[bytes, Message] | RemoteEncryptionError] = []
        k = 0
        for data, epoch in zip(self._payloads, self._epochs, strict=True):
            if isinstance(epoch, RemoteEncryptionError):
                out.append(epoch)
                continue
            opened = opened_all[k]
            k += 1
            if isinstance(opened, RemoteEncryptionError):
                out.append(opened)
                continue
            try:
                out.append(accept(epoch, opened, data))
            except RemoteEncryptionError as exc:
                out.append(exc)
        return out
