"""The listener options every stream section shares, in one place.

``[replication]``, ``[collection]``, ``[bamboo_p2p]`` and ``[store_sync]`` each
serve a protocol on ``listen`` through :class:`transports.guarded.GuardedListener`
and dial their ``peers``; they take these keys alike (defaults shown)::

    max_connections = 256            # at once; one more is closed on accept
    idle_timeout_s = 300.0           # no byte either way while waiting for the peer (0: never)
    write_timeout_s = 60.0           # one write waits this long for a peer that does not read
    frame_deadline_s = 30.0          # a frame's first byte to its last (a trickle is cut)
    max_buffered_bytes = 67108864    # partly received frames, all connections together
    handshake_timeout_s = 10.0       # TLS handshake
    tls_cert = "node.pem"            # TLS on: certificate chain and key (PEM)
    tls_key = "node.key"
    tls_client_ca = "clients-ca.pem" # mutual TLS: clients need a certificate this CA signed
    tls_client_fingerprints = ["ab12..."]  # and only these (SHA-256 of the DER certificate)
    peer_tls_ca = "peers-ca.pem"     # dial peers over TLS, trusting this CA
    peer_tls_cert = "node-client.pem"  # and present this certificate (peers asking for one)
    peer_tls_key = "node-client.key"

A section parses them with :func:`parse_listener` before looking at its own
keys. Paths are relative to the config file. Certificates and keys are loaded
when the config is read, so a bad file is a one-line :class:`ConfigError` from
``store-node check-config``, not a failure at the first connection.
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store_node.errors import ConfigError
from transports.guarded import ListenerLimits, TlsServer, normalize_fingerprint, tls_client_context

#: The keys :func:`parse_listener` takes out of a section.
LISTENER_KEYS = frozenset(
    {
        "max_connections",
        "idle_timeout_s",
        "write_timeout_s",
        "frame_deadline_s",
        "max_buffered_bytes",
        "handshake_timeout_s",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "tls_client_fingerprints",
        "peer_tls_ca",
        "peer_tls_cert",
        "peer_tls_key",
    }
)

_DEFAULTS = ListenerLimits()


@dataclass(frozen=True, slots=True)
class ListenerConfig:
    """One section's listener limits, its TLS, and how it dials its peers."""

    limits: ListenerLimits = field(default_factory=ListenerLimits)
    #: TLS of the listener (None: plain TCP).
    tls: TlsServer | None = None
    #: TLS towards the section's peers: CA, and the certificate and key to present.
    peer_tls_ca: Path | None = None
    peer_tls_cert: Path | None = None
    peer_tls_key: Path | None = None

    def peer_context(self) -> ssl.SSLContext | None:
        """The client context for the section's outgoing connections (None: plain TCP)."""
        if self.peer_tls_ca is None and self.peer_tls_cert is None:
            return None
        return tls_client_context(self.peer_tls_ca, self.peer_tls_cert, self.peer_tls_key)


def _timeout(raw: dict[str, Any], section: str, key: str, default: float | None) -> float | None:
    if key not in raw:
        return default
    value = raw.pop(key)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{section}.{key} must be a non-negative number of seconds (0: never)")
    return float(value) or None


def _integer(raw: dict[str, Any], section: str, key: str, default: int) -> int:
    value = raw.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**40:
        raise ConfigError(f"{section}.{key} must be a positive integer, got {str(value)[:40]!r}")
    return value


def _path(raw: dict[str, Any], section: str, key: str, base: Path) -> Path | None:
    value = raw.pop(key, "")
    if not isinstance(value, str) or "\x00" in value:
        raise ConfigError(f"{section}.{key} must be a path")
    return base / value if value else None


def parse_listener(raw: dict[str, Any], section: str, base: Path) -> ListenerConfig:
    """Take the listener keys out of ``raw`` (a section's table, changed in place) and
    validate them; one-line :class:`ConfigError` naming ``section.key``."""
    limits = ListenerLimits(
        max_connections=_integer(raw, section, "max_connections", _DEFAULTS.max_connections),
        idle_timeout_s=_timeout(raw, section, "idle_timeout_s", _DEFAULTS.idle_timeout_s),
        write_timeout_s=_timeout(raw, section, "write_timeout_s", _DEFAULTS.write_timeout_s),
        frame_deadline_s=_timeout(raw, section, "frame_deadline_s", _DEFAULTS.frame_deadline_s),
        max_buffered_bytes=_integer(
            raw, section, "max_buffered_bytes", _DEFAULTS.max_buffered_bytes
        ),
        handshake_timeout_s=_timeout(
            raw, section, "handshake_timeout_s", _DEFAULTS.handshake_timeout_s
        )
        or _DEFAULTS.handshake_timeout_s,
    )
    cert, key, ca = (_path(raw, section, k, base) for k in ("tls_cert", "tls_key", "tls_client_ca"))
    prints = raw.pop("tls_client_fingerprints", [])
    if not isinstance(prints, list) or not all(isinstance(p, str) for p in prints):
        raise ConfigError(f"{section}.tls_client_fingerprints must be a list of SHA-256 hex")
    try:
        fingerprints = frozenset(normalize_fingerprint(p) for p in prints)
    except ValueError as exc:
        raise ConfigError(f"{section}.tls_client_fingerprints: {exc}") from None
    if (cert is None) != (key is None):
        raise ConfigError(f"{section}.tls_cert and {section}.tls_key go together")
    if cert is None and (ca is not None or fingerprints):
        raise ConfigError(f"{section}.tls_client_ca and tls_client_fingerprints need tls_cert")
    if fingerprints and ca is None:
        raise ConfigError(f"{section}.tls_client_fingerprints needs tls_client_ca")
    tls = None
    if cert is not None and key is not None:
        tls = TlsServer(cert, key, ca, fingerprints)
        _load(section, tls.context)
    config = ListenerConfig(
        limits,
        tls,
        *(_path(raw, section, k, base) for k in ("peer_tls_ca", "peer_tls_cert", "peer_tls_key")),
    )
    if (config.peer_tls_cert is None) != (config.peer_tls_key is None):
        raise ConfigError(f"{section}.peer_tls_cert and {section}.peer_tls_key go together")
    _load(section, config.peer_context)
    return config


def _load(section: str, make: Any) -> None:
    try:
        make()
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{section}: TLS files cannot be loaded: {exc}") from None


__all__ = ["LISTENER_KEYS", "ListenerConfig", "parse_listener"]
