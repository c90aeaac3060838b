"""The channel-keys file: epochs for reading sealed archives (``docs/encryption.md``, "Keys file").

A JSON object, one entry per channel::

    {
      "channels": {
        "room": {
          "epochs": [
            {"number": 0, "key": "<32 bytes hex>",
             "roster": [["alice", "<ed25519 public hex>"], ["bob", "<hex>"]]}
          ],
          "identity": "<64 bytes hex: Identity.to_bytes()>",
          "trusted_issuers": ["<ed25519 public hex>"],
          "key_packages": ["<key package hex>"]
        }
      }
    }

Per channel, ``epochs`` (raw epochs, roster in signer order: the order a key package
carries it) and/or ``key_packages`` (opened with ``identity``, accepted from
``trusted_issuers``, as a member would). Whoever holds the file reads every message of
those epochs: keep it as secret as the keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdk.encryption.channel import ChannelEncryption
from sdk.encryption.errors import EncryptionError, EncryptionUsageError
from sdk.encryption.keys import Epoch, Identity
from sdk.encryption.ring import KeyRing


class KeyFileError(EncryptionUsageError):
    """The keys file cannot be read or does not follow the format."""


def _hex(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise KeyFileError(f"{what}: expected a hex string")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise KeyFileError(f"{what}: not hex") from None


def _ring(channel_id: str, entry: Any) -> KeyRing:
    if not isinstance(entry, dict):
        raise KeyFileError(f"channel {channel_id!r}: expected an object")
    issuers = {_hex(k, f"{channel_id}: trusted_issuers") for k in entry.get("trusted_issuers", [])}
    ring = KeyRing(channel_id, issuers)
    try:
        for i, epoch in enumerate(entry.get("epochs", [])):
            where = f"{channel_id}: epochs[{i}]"
            members = epoch["roster"]
            roster = tuple((str(s), _hex(k, f"{where}: roster")) for s, k in members)
            ring.add(Epoch(int(epoch["number"]), _hex(epoch["key"], f"{where}: key"), roster))
        packages = entry.get("key_packages", [])
        if packages:
            if "identity" not in entry:
                raise KeyFileError(f"{channel_id}: key_packages need the member's identity")
            identity = Identity.from_bytes(_hex(entry["identity"], f"{channel_id}: identity"))
            for i, package in enumerate(packages):
                ring.accept(_hex(package, f"{channel_id}: key_packages[{i}]"), identity)
    except KeyFileError:
        raise
    except (EncryptionError, KeyError, TypeError, ValueError) as exc:
        raise KeyFileError(f"channel {channel_id!r}: {type(exc).__name__}: {exc}") from None
    return ring


def load_key_rings(path: str | Path) -> dict[str, KeyRing]:
    """The key ring of every channel in the keys file at ``path`` (module docstring).

    Raises :class:`KeyFileError` for a file that cannot be read or parsed, or an entry
    that is not a valid epoch or an acceptable key package.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: {exc}") from None
    channels = data.get("channels") if isinstance(data, dict) else None
    if not isinstance(channels, dict):
        raise KeyFileError(f"{path}: expected an object with a 'channels' object")
    return {str(channel): _ring(str(channel), entry) for channel, entry in channels.items()}


def readers(rings: dict[str, KeyRing]) -> dict[str, ChannelEncryption]:
    """A handle per channel that opens (never seals: it has no roster place) sealed envelopes."""
    return {
        channel: ChannelEncryption(ring, "", Identity.generate(), cache_size=0)
        for channel, ring in rings.items()
    }


def epoch_entry(epoch: Epoch) -> dict[str, Any]:
    """``epoch`` as a keys-file ``epochs`` entry (what an issuer or member writes out)."""
    return {
        "number": epoch.number,
        "key": epoch.key.hex(),
        "roster": [[sender, public.hex()] for sender, public in epoch.roster],
    }
