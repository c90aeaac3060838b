"""A member's key ring for one channel: every epoch it was given, newest used to send."""

from __future__ import annotations

from collections.abc import Collection

from sdk.encryption.errors import EncryptionUsageError, KeyPackageNotForUs, UntrustedKeyPackage
from sdk.encryption.key_package import open_key_package
from sdk.encryption.keys import Epoch, Identity


class KeyRing:
    """The epochs of ``channel_id`` this member holds.

    Epochs arrive in key packages (:meth:`accept`) or directly (:meth:`add`, for
    the issuer who made them). Old epochs stay, so history sealed under them can
    still be read; :attr:`current` (the highest number) is used to send.
    ``trusted_issuers``: ed25519 public keys whose key packages are accepted.
    """

    def __init__(self, channel_id: str, trusted_issuers: Collection[bytes] = ()) -> None:
        self.channel_id = channel_id
        #: ed25519 public keys allowed to issue epochs of this channel.
        self.trusted_issuers: set[bytes] = set(trusted_issuers)
        self._epochs: dict[int, Epoch] = {}
        self._current: Epoch | None = None

    def add(self, epoch: Epoch) -> None:
        """Hold ``epoch``. Adding a known epoch again is a no-op; with another key or
        roster it raises :class:`UntrustedKeyPackage` (an epoch never changes)."""
        known = self._epochs.get(epoch.number)
        if known is not None:
            if known != epoch:
                raise UntrustedKeyPackage(f"epoch {epoch.number} is already known, differently")
            return
        self._epochs[epoch.number] = epoch
        if self._current is None or epoch.number > self._current.number:
            self._current = epoch

    def accept(self, package: bytes, identity: Identity) -> Epoch:
        """Open a key package sealed to ``identity`` and hold its epoch; return it.

        Raises what :func:`~sdk.encryption.open_key_package` raises, and
        :class:`KeyPackageNotForUs` for a package of another channel.
        """
        opened = open_key_package(package, identity, self.trusted_issuers)
        if opened.channel_id != self.channel_id:
            raise KeyPackageNotForUs(
                f"a key package for channel {opened.channel_id!r}, not {self.channel_id!r}"
            )
        self.add(opened.epoch)
        return opened.epoch

    def get(self, number: int) -> Epoch | None:
        """The epoch numbered ``number``, or ``None``."""
        return self._epochs.get(number)

    @property
    def current(self) -> Epoch:
        """The newest epoch (raises :class:`EncryptionUsageError` when none is held)."""
        if self._current is None:
            raise EncryptionUsageError(f"no epoch of {self.channel_id!r} is held yet")
        return self._current

    def numbers(self) -> list[int]:
        """Numbers of the epochs held, ascending."""
        return sorted(self._epochs)

    def __len__(self) -> int:
        return len(self._epochs)
