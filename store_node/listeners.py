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

A section reads them with :func:`parse_listener`, through the same
:class:`~store_node.sections.Section` it reads its own keys with. Paths are
relative to the config file. Certificates and keys are loaded when the config
is read, so a bad file is a one-line :class:`ConfigError` from
``store-node check-config``, not a failure at the first connection. The
client context for dialling peers is built once and rebuilt only when one of
its files changes (by modification time), not read again for every dial.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store_node.errors import ConfigError
from store_node.sections import Section
from transports.guarded import ListenerLimits, TlsServer, normalize_fingerprint, tls_client_context

_DEFAULTS = ListenerLimits()
_MAX = 2**40


class _PeerContext:
    """The client context of one section's dials, kept while its files are unchanged."""

    __slots__ = ("context", "stamp")

    def __init__(self) -> None:
        self.context: ssl.SSLContext | None = None
        #: The files' modification times when ``context`` was built.
        self.stamp: tuple[int | None, ...] = ()

    def get(self, ca: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
        """The context for these files: the one built before while none of them changed
        (a stat each), else a new one. Raises what loading them raises."""
        stamp = tuple(None if p is None else p.stat().st_mtime_ns for p in (ca, cert, key))
        if self.context is None or stamp != self.stamp:
            # Stamped before reading: a file changed meanwhile is read again next time.
            self.context = tls_client_context(ca, cert, key)
            self.stamp = stamp
        return self.context


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
    _peer: _PeerContext = field(default_factory=_PeerContext, init=False, repr=False, compare=False)

    def peer_context(self) -> ssl.SSLContext | None:
        """The client context for the section's outgoing connections (None: plain TCP):
        built once, and again only when one of its files changed (modification time)."""
        if self.peer_tls_ca is None and self.peer_tls_cert is None:
            return None
        return self._peer.get(self.peer_tls_ca, self.peer_tls_cert, self.peer_tls_key)


def _timeout(section: Section, key: str, default: float | None) -> float | None:
    return section.duration(key, default, zero="0: never") or None


def parse_listener(section: Section, base: Path) -> ListenerConfig:
    """Take the listener keys out of ``section`` and validate them; one-line
    :class:`ConfigError` naming ``section.key``."""
    name = section.name
    limits = ListenerLimits(
        max_connections=section.integer("max_connections", _DEFAULTS.max_connections, high=_MAX),
        idle_timeout_s=_timeout(section, "idle_timeout_s", _DEFAULTS.idle_timeout_s),
        write_timeout_s=_timeout(section, "write_timeout_s", _DEFAULTS.write_timeout_s),
        frame_deadline_s=_timeout(section, "frame_deadline_s", _DEFAULTS.frame_deadline_s),
        max_buffered_bytes=section.integer(
            "max_buffered_bytes", _DEFAULTS.max_buffered_bytes, high=_MAX
        ),
        handshake_timeout_s=_timeout(section, "handshake_timeout_s", _DEFAULTS.handshake_timeout_s)
        or _DEFAULTS.handshake_timeout_s,
    )
    cert, key, ca = (
        section.optional_path(k, base) for k in ("tls_cert", "tls_key", "tls_client_ca")
    )
    prints = section.take("tls_client_fingerprints", list, [])
    if not all(isinstance(p, str) for p in prints):
        raise ConfigError(f"{name}.tls_client_fingerprints must be a list of SHA-256 hex")
    try:
        fingerprints = frozenset(normalize_fingerprint(p) for p in prints)
    except ValueError as exc:
        raise ConfigError(f"{name}.tls_client_fingerprints: {exc}") from None
    if (cert is None) != (key is None):
        raise ConfigError(f"{name}.tls_cert and {name}.tls_key go together")
    if cert is None and (ca is not None or fingerprints):
        raise ConfigError(f"{name}.tls_client_ca and tls_client_fingerprints need tls_cert")
    if fingerprints and ca is None:
        raise ConfigError(f"{name}.tls_client_fingerprints needs tls_client_ca")
    tls = None
    if cert is not None and key is not None:
        tls = TlsServer(cert, key, ca, fingerprints)
        _load(name, tls.context)
    config = ListenerConfig(
        limits,
        tls,
        *(section.optional_path(k, base) for k in ("peer_tls_ca", "peer_tls_cert", "peer_tls_key")),
    )
    if (config.peer_tls_cert is None) != (config.peer_tls_key is None):
        raise ConfigError(f"{name}.peer_tls_cert and {name}.peer_tls_key go together")
    _load(name, config.peer_context)
    return config


def _load(section: str, make: Any) -> None:
    try:
        make()
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{section}: TLS files cannot be loaded: {exc}") from None


__all__ = ["ListenerConfig", "parse_listener"]
