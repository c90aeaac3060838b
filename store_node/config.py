"""The store node's configuration: a TOML file read with :mod:`tomllib`.

Every section and key is optional except ``[ingest] channels`` for ``serve``;
unknown keys are errors (a typo must not silently fall back to a default).
``examples/store_node.toml`` documents every key. Relative paths are relative
to the configuration file.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from store_node.errors import ConfigError
from store_node.replication import ReplicationConfig, parse_replication

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """``[archive]``: where messages are kept."""

    #: ``sqlite`` (default) or ``postgresql``.
    backend: str = "sqlite"
    #: SQLite file.
    path: Path = Path("store.db")
    #: SQLite ``synchronous``: ``normal`` or ``full`` (see :mod:`store_node.archive.sqlite`).
    synchronous: str = "normal"
    #: PostgreSQL connection string (libpq DSN or URL).
    dsn: str = ""
    #: PostgreSQL schema holding the archive's tables.
    schema: str = "chorus_store"


@dataclass(frozen=True, slots=True)
class IngestConfig:
    """``[ingest]``: which channels to archive and how to batch writes."""

    channels: tuple[str, ...] = ()
    #: Most rows per write transaction.
    batch_size: int = 1000
    #: Longest a received message waits before its batch is written (ms).
    batch_interval_ms: int = 50
    #: Received-but-unwritten messages before ingest stops reading the transport.
    queue_size: int = 20_000
    #: ... or this many bytes of them.
    queue_bytes: int = 64 * 1024 * 1024
    #: Archive ephemeral messages too (Waku Store skips them; analytics counts them).
    archive_ephemeral: bool = True


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """``[transport]``: ``kind`` (``mqtt``, ``libp2p`` or ``factory``) and its options."""

    kind: str = "mqtt"
    #: For ``kind = "factory"``: ``"package.module:callable"`` returning a Transport.
    factory: str = ""
    #: Every other key, passed to the adapter as keyword arguments.
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    """``[grpc]``: the query API, its limits and its optional bearer tokens."""

    listen: str = "127.0.0.1:50051"
    #: Largest request message accepted (bigger ones get RESOURCE_EXHAUSTED).
    max_request_bytes: int = 256 * 1024
    #: Most ids plus hashes in one lookup (more get INVALID_ARGUMENT).
    max_ids_per_request: int = 500
    #: Page size when the request sets none.
    default_page_size: int = 100
    #: Larger requested page sizes are clamped to this (Waku Store v3 behaviour).
    max_page_size: int = 1000
    #: Raw bytes per response page; a page ends early rather than exceed it.
    max_response_bytes: int = 3 * 1024 * 1024
    #: Requests served at once; more get RESOURCE_EXHAUSTED.
    max_concurrent_rpcs: int = 64
    #: Accepted bearer tokens; empty means no authentication.
    tokens: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """``[metrics]``: Prometheus exposition; empty ``listen`` disables it."""

    listen: str = "127.0.0.1:9464"


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """``[retention]``: delete by age and/or total size, checked every ``interval_s``."""

    max_age_days: float | None = None
    max_bytes: int | None = None
    interval_s: float = 60.0


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``[log]``: level; output is JSON lines on stderr."""

    level: str = "info"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """The whole configuration."""

    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    grpc: GrpcConfig = field(default_factory=GrpcConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    log: LogConfig = field(default_factory=LogConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)


_INGEST = IngestConfig()
_GRPC = GrpcConfig()
_METRICS = MetricsConfig()


class _Section:
    """Typed, consumed access to one TOML table; leftovers are unknown keys."""

    def __init__(self, name: str, raw: Any) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"[{name}] must be a table")
        self.name = name
        self.raw = dict(raw)

    def take(self, key: str, kind: type[T], default: T) -> T:
        if key not in self.raw:
            return default
        value = self.raw.pop(key)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{self.name}.{key} must be {kind.__name__}, got {value!r}")
        return value  # type: ignore[no-any-return]

    def positive(self, key: str, default: int) -> int:
        value = self.take(key, int, default)
        if value < 1:
            raise ConfigError(f"{self.name}.{key} must be at least 1, got {value}")
        return value

    def done(self) -> None:
        if self.raw:
            raise ConfigError(f"unknown key(s) in [{self.name}]: {', '.join(sorted(self.raw))}")


def _listen(section: _Section, default: str, *, allow_empty: bool = False) -> str:
    value = section.take("listen", str, default)
    if not value and allow_empty:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{section.name}.listen must be HOST:PORT, got {value!r}")
    return value


def _tokens(section: _Section, base: Path) -> tuple[str, ...]:
    tokens: list[str] = []
    env = section.take("token_env", str, "")
    if env:
        value = os.environ.get(env)
        if not value:
            raise ConfigError(f"grpc.token_env names {env}, which is not set")
        tokens.append(value.strip())
    file = section.take("token_file", str, "")
    if file:
        path = base / file
        try:
            tokens += [t.strip() for t in path.read_text().splitlines() if t.strip()]
        except OSError as exc:
            raise ConfigError(f"grpc.token_file {path}: {exc}") from exc
    return tuple(tokens)


def parse_config(data: Mapping[str, Any], base: Path = Path(".")) -> NodeConfig:
    """Build a :class:`NodeConfig` from parsed TOML; ``base`` resolves relative paths."""
    top = dict(data)
    replication = parse_replication(top.pop("replication", {}), base)
    sections = {
        name: _Section(name, top.pop(name, {}))
        for name in ("archive", "ingest", "transport", "grpc", "metrics", "retention", "log")
    }
    if top:
        raise ConfigError(f"unknown section(s): {', '.join(sorted(top))}")

    a = sections["archive"]
    backend = a.take("backend", str, "sqlite")
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(f"archive.backend must be sqlite or postgresql, got {backend!r}")
    archive = ArchiveConfig(
        backend=backend,
        path=base / a.take("path", str, "store.db"),
        synchronous=a.take("synchronous", str, "normal").lower(),
        dsn=a.take("dsn", str, ""),
        schema=a.take("schema", str, "chorus_store"),
    )
    if archive.synchronous not in ("normal", "full"):
        raise ConfigError(
            f"archive.synchronous must be normal or full, got {archive.synchronous!r}"
        )
    if backend == "postgresql" and not archive.dsn:
        raise ConfigError("archive.dsn is required for the postgresql backend")
    a.done()

    i = sections["ingest"]
    channels = i.take("channels", list, [])
    if not all(isinstance(c, str) and c for c in channels):
        raise ConfigError("ingest.channels must be a list of non-empty strings")
    ingest = IngestConfig(
        channels=tuple(channels),
        batch_size=i.positive("batch_size", _INGEST.batch_size),
        batch_interval_ms=i.positive("batch_interval_ms", _INGEST.batch_interval_ms),
        queue_size=i.positive("queue_size", _INGEST.queue_size),
        queue_bytes=i.positive("queue_bytes", _INGEST.queue_bytes),
        archive_ephemeral=i.take("archive_ephemeral", bool, True),
    )
    i.done()

    t = sections["transport"]
    kind = t.take("kind", str, "mqtt")
    factory = t.take("factory", str, "")
    if kind not in ("mqtt", "libp2p", "factory"):
        raise ConfigError(f"transport.kind must be mqtt, libp2p or factory, got {kind!r}")
    if kind == "factory" and ":" not in factory:
        raise ConfigError("transport.factory must be 'package.module:callable' for kind factory")
    transport = TransportConfig(kind=kind, factory=factory, options=dict(t.raw))
    t.raw.clear()

    g = sections["grpc"]
    grpc = GrpcConfig(
        listen=_listen(g, _GRPC.listen),
        max_request_bytes=g.positive("max_request_bytes", _GRPC.max_request_bytes),
        max_ids_per_request=g.positive("max_ids_per_request", _GRPC.max_ids_per_request),
        default_page_size=g.positive("default_page_size", _GRPC.default_page_size),
        max_page_size=g.positive("max_page_size", _GRPC.max_page_size),
        max_response_bytes=g.positive("max_response_bytes", _GRPC.max_response_bytes),
        max_concurrent_rpcs=g.positive("max_concurrent_rpcs", _GRPC.max_concurrent_rpcs),
        tokens=_tokens(g, base),
    )
    if grpc.default_page_size > grpc.max_page_size:
        # Lowering only max_page_size must not require touching the default too.
        grpc = dataclasses.replace(grpc, default_page_size=grpc.max_page_size)
    g.done()

    m = sections["metrics"]
    metrics = MetricsConfig(listen=_listen(m, _METRICS.listen, allow_empty=True))
    m.done()

    r = sections["retention"]
    max_age = r.take("max_age_days", float, -1.0)
    max_bytes = r.take("max_bytes", int, -1)
    retention = RetentionConfig(
        max_age_days=max_age if max_age >= 0 else None,
        max_bytes=max_bytes if max_bytes >= 0 else None,
        interval_s=r.take("interval_s", float, 60.0),
    )
    if retention.interval_s <= 0:
        raise ConfigError("retention.interval_s must be positive")
    r.done()

    lg = sections["log"]
    level = lg.take("level", str, "info").lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log.level must be debug, info, warning or error, got {level!r}")
    lg.done()

    return NodeConfig(
        archive, ingest, transport, grpc, metrics, retention, LogConfig(level), replication
    )


def load_config(path: str | Path) -> NodeConfig:
    """Read and validate a TOML configuration file."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return parse_config(data, path.parent)
