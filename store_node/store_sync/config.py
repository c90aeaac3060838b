"""``[store_sync]``: reconcile this node's archive with other store nodes.

::

    [store_sync]
    listen = "127.0.0.1:7700"       # serve sessions here ("" = do not serve)
    peers = ["10.0.0.2:7700"]       # other store nodes: synced on start and every interval_s
    interval_s = 60.0
    window_s = 86400.0              # only sync the last day (default: the whole archive)
    index_interval_s = 1.0          # how often new archive rows are indexed
    branching = 4                   # reconciliation shape (sdk.sync.rbsr)
    threshold = 4
    max_round_messages = 1000000    # bound on a peer's round (keys)
    # and the listener options every section shares (connection cap, timeouts,
    # TLS, peer authentication, TLS towards peers): store_node.listeners

    [store_sync.peer_channels]        # needs tls_client_ca: peers by certificate
    "3f5a...e1" = ["team-a", "team-b"]  # this peer syncs these channels only
    "9c0d...42" = ["*"]                 # this one the whole archive

With ``peer_channels``, a peer connecting to ``listen`` is served only if its
client certificate's SHA-256 fingerprint is listed, and only the channels listed
for it: it is sent no message of another channel and what it sends of another
channel is dropped (its session still compares the whole archive's keys, so it
learns the times and hashes of other channels' messages, never their contents).
Sessions this node opens to its ``peers`` are not limited.

Started by ``store-node serve`` when ``listen`` or ``peers`` is set. Peers
should archive the same channels: the whole archive is reconciled, except
messages older than the retention cutoff (``[retention] max_age_days``) or the
window, whichever is later (of either peer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from store_node.errors import ConfigError
from store_node.listeners import ListenerConfig, parse_listener
from store_node.sections import Section, channel_ids
from transports.guarded import normalize_fingerprint


@dataclass(frozen=True, slots=True)
class StoreSyncConfig:
    """``[store_sync]``: see the module docstring."""

    listen: str = ""
    peers: tuple[str, ...] = ()
    interval_s: float = 60.0
    window_s: float | None = None
    index_interval_s: float = 1.0
    branching: int = 4
    threshold: int = 4
    max_round_messages: int = 1_000_000
    listener: ListenerConfig = field(default_factory=ListenerConfig)
    #: Client certificate fingerprint -> the channels that peer may sync (``None``: all).
    peer_channels: Mapping[str, frozenset[str] | None] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        """Whether the section asks for anything (serving or peers)."""
        return bool(self.listen or self.peers)


def parse_store_sync(raw: object, base: Path = Path(".")) -> StoreSyncConfig:
    """Validate the ``[store_sync]`` table (``{}`` when absent); one-line ConfigError.
    ``base`` resolves the listener's certificate paths."""
    section = Section("store_sync", raw)
    listener = parse_listener(section, base)
    branching = section.integer("branching", 4, 2, 1024)
    threshold = section.integer("threshold", 4, 2, 100_000)
    if threshold < branching:
        raise ConfigError("store_sync.threshold must be at least store_sync.branching")
    config = StoreSyncConfig(
        listen=section.address("listen"),
        peers=section.addresses("peers"),
        interval_s=section.duration("interval_s", 60.0, positive=True, below=1e9),
        window_s=section.duration("window_s", None, positive=True, below=1e9),
        index_interval_s=section.duration("index_interval_s", 1.0, positive=True, below=1e9),
        branching=branching,
        threshold=threshold,
        max_round_messages=section.integer("max_round_messages", 1_000_000, 1_000, 100_000_000),
        listener=listener,
        peer_channels=_peer_channels(section.raw.pop("peer_channels", {}), listener),
    )
    section.done()
    return config


def _peer_channels(raw: object, listener: ListenerConfig) -> dict[str, frozenset[str] | None]:
    if not isinstance(raw, dict):
        raise ConfigError("store_sync.peer_channels must be a table: fingerprint = [channels]")
    if raw and (listener.tls is None or listener.tls.client_ca_file is None):
        raise ConfigError("store_sync.peer_channels needs tls_client_ca (peers by certificate)")
    limits: dict[str, frozenset[str] | None] = {}
    for key, channels in raw.items():
        try:
            peer = normalize_fingerprint(str(key))
        except ValueError as exc:
            raise ConfigError(f"store_sync.peer_channels: {exc}") from None
        name = f"store_sync.peer_channels.{key[:16]}..."
        if channels == []:
            raise ConfigError(f"{name} must be a non-empty list of channel ids")
        limits[peer] = None if channels == ["*"] else frozenset(channel_ids(channels, name))
    return limits


__all__ = ["StoreSyncConfig", "parse_store_sync"]
