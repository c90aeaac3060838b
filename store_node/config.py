"""The store node's configuration: a TOML file read with :mod:`tomllib`.

Every section and key is optional except ``[ingest] channels`` for ``serve``;
unknown keys are errors (a typo must not silently fall back to a default).
``examples/store_node.toml`` documents every key. Relative paths are relative
to the configuration file.

Every value is checked here, once, before anything starts: its type, its range
(ports 1-65535, finite non-negative durations, sizes that fit the library they
configure), channel ids by :func:`transports.base.validate_channel_id`, and the
transport's options by the adapter's own keyword parameters. Any failure is a
:class:`~store_node.errors.ConfigError` whose message is one line naming the
key; ``store-node`` prints it and exits 2. That includes files that are not
UTF-8, not TOML, too large or nested too deeply: any bytes give a one-line error.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
import os
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store_node.addresses import parse_listen, show
from store_node.bamboo_p2p import BambooP2PConfig, parse_bamboo_p2p
from store_node.collection import CollectionNodeConfig, parse_collection
from store_node.errors import ConfigError
from store_node.replication import ReplicationConfig, parse_replication
from store_node.sections import Section, channel_ids
from store_node.store_sync.config import StoreSyncConfig, parse_store_sync

#: Largest configuration file read; a real one is a few KiB.
MAX_CONFIG_BYTES = 1024 * 1024
#: Deepest nesting of tables and arrays accepted (the format itself needs 3).
MAX_NESTING = 8
#: gRPC's channel options are C ints.
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    """``[archive]``: where messages are kept."""

    #: ``sqlite`` (default) or ``postgresql``.
    backend: str = "sqlite"
    #: SQLite file; its folder must exist.
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
    #: Every other key, passed to the adapter as keyword arguments (``tls_*`` and
    #: ``password_env`` already turned into ``tls`` and ``password`` for ``mqtt``).
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """One accepted bearer token and the channels it may read (``None``: every channel)."""

    token: str
    channels: frozenset[str] | None = None

    def __repr__(self) -> str:
        # Never print the secret (configs and grants end up in logs and tracebacks).
        return f"TokenGrant(token=<{len(self.token)} chars>, channels={self.channels!r})"


@dataclass(frozen=True, slots=True)
class GrpcConfig:
    """``[grpc]``: the query API, its limits, TLS and its optional bearer tokens."""

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
    #: Accepted bearer tokens with their read permissions; empty means no authentication.
    grants: tuple[TokenGrant, ...] = ()
    #: PEM server certificate chain and key: TLS on (both or neither).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: PEM CA bundle: clients must present a certificate it signed (mutual TLS).
    tls_client_ca_file: Path | None = None

    @property
    def tokens(self) -> tuple[str, ...]:
        """Every accepted token, whatever its channels."""
        return tuple(g.token for g in self.grants)

    @property
    def tls(self) -> bool:
        """Whether the server speaks TLS."""
        return self.tls_cert_file is not None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """``[metrics]``: ``/metrics``, ``/healthz``, ``/readyz`` over HTTP; ``""`` disables."""

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
    store_sync: StoreSyncConfig = field(default_factory=StoreSyncConfig)
    collection: CollectionNodeConfig = field(default_factory=CollectionNodeConfig)
    bamboo_p2p: BambooP2PConfig = field(default_factory=BambooP2PConfig)


_INGEST = IngestConfig()
_GRPC = GrpcConfig()
_METRICS = MetricsConfig()


def _listen(section: Section, default: str, *, allow_empty: bool = False) -> str:
    value = section.take("listen", str, default)
    if not value and allow_empty:
        return value
    parse_listen(value, f"{section.name}.listen")
    return value


def _read_secret_file(path: Path, key: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key} {path}: {type(exc).__name__}: {exc}") from None


def _secret_env(name: str, key: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"{key} names {name}, which is not set")
    return value


def _grant_tokens(section: Section, base: Path, key: str) -> list[str]:
    """Tokens named by ``token_env`` and/or ``token_file`` (one per line) in ``section``."""
    tokens: list[str] = []
    env = section.take("token_env", str, "")
    if env:
        tokens.append(_secret_env(env, f"{key}.token_env"))
    file = section.path("token_file", base, None)
    if file is not None:
        text = _read_secret_file(file, f"{key}.token_file")
        tokens += [t.strip() for t in text.splitlines() if t.strip()]
    for token in tokens:
        if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            # gRPC metadata values are printable ASCII; such a token could never match.
            raise ConfigError(f"{key}: a token must be printable ASCII without spaces")
    return tokens


def _grants(section: Section, base: Path) -> tuple[TokenGrant, ...]:
    grants = [TokenGrant(t) for t in _grant_tokens(section, base, "grpc")]
    access = section.take("access", list, [])
    for n, raw in enumerate(access):
        entry = Section(f"grpc.access[{n}]", raw)
        tokens = _grant_tokens(entry, base, entry.name)
        if not tokens:
            raise ConfigError(f"{entry.name} needs token_env or token_file")
        channels = frozenset(channel_ids(entry.raw.pop("channels", None), f"{entry.name}.channels"))
        entry.done()
        grants += [TokenGrant(t, channels) for t in tokens]
    if len({g.token for g in grants}) != len(grants):
        raise ConfigError("grpc: the same token is configured twice")
    return tuple(grants)


# -- transport options, checked against the adapter's own keyword parameters ----------------

#: Where each built-in transport kind's factory lives (called with the section's options).
ADAPTERS = {
    "mqtt": "transports.mqtt:MqttTransport",
    "libp2p": "transports.libp2p:Libp2pTransport",
}

_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "None": (type(None),),
}


def _matches(value: object, annotation: str) -> bool | None:
    """Whether ``value`` fits a (string) annotation; ``None`` when the annotation is opaque."""
    for part in (p.strip() for p in annotation.split("|")):
        if part.startswith("Literal[") and part.endswith("]"):
            try:
                allowed = ast.literal_eval(f"({part[8:-1]},)")
            except (ValueError, SyntaxError):
                return None
            if any(value == a and type(value) is type(a) for a in allowed):
                return True
        elif part.startswith("Sequence[str]") or part.startswith("list[str]"):
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return True
        elif part in _SIMPLE_TYPES:
            types = _SIMPLE_TYPES[part]
            if isinstance(value, bool) and bool not in types:
                continue
            if isinstance(value, types):
                if isinstance(value, float) and not math.isfinite(value):
                    continue
                return True
        else:
            return None
    return False


def _check_options(kind: str, target: str, options: dict[str, Any]) -> None:
    """Unknown option names and values of the wrong type are config errors."""
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except ImportError as exc:
        raise ConfigError(f"transport {kind!r} is not installed: {exc}") from None
    except AttributeError:
        raise ConfigError(f"transport.factory {target}: no such callable") from None
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    named = {
        n: p
        for n, p in params.items()
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    for name, value in options.items():
        if name not in named:
            known = ", ".join(sorted(named))
            raise ConfigError(f"transport ({kind}) has no option {show(name, 40)}; known: {known}")
        annotation = named[name].annotation
        if isinstance(annotation, str) and _matches(value, annotation) is False:
            raise ConfigError(f"transport.{name} must be {annotation}, got {show(value)}")
        if isinstance(value, int) and not isinstance(value, bool):
            if name == "port" and not 1 <= value <= 65535:
                raise ConfigError(f"transport.port must be 1..65535, got {value}")
            if value < 0:
                raise ConfigError(f"transport.{name} must not be negative, got {value}")


def _mqtt_tls(options: dict[str, Any], base: Path) -> None:
    """``tls = true`` / ``tls_ca_file`` / ``tls_cert_file`` + ``tls_key_file`` -> an SSLContext."""
    wanted = options.pop("tls", False)
    if not isinstance(wanted, bool):
        raise ConfigError(f"transport.tls must be bool, got {show(wanted)}")
    files = {}
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        value = options.pop(key, None)
        if value is not None:
            if not isinstance(value, str) or not value or "\x00" in value:
                raise ConfigError(f"transport.{key} must be a path, got {show(value)}")
            files[key] = base / value
    if not wanted and not files:
        return
    if ("tls_cert_file" in files) != ("tls_key_file" in files):
        raise ConfigError("transport.tls_cert_file and tls_key_file go together")
    try:
        context = ssl.create_default_context(cafile=files.get("tls_ca_file"))
        if "tls_cert_file" in files:
            context.load_cert_chain(files["tls_cert_file"], files["tls_key_file"])
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"transport TLS files: {type(exc).__name__}: {exc}") from None
    options["tls"] = context


def _transport(t: Section, base: Path) -> TransportConfig:
    kind = t.take("kind", str, "mqtt")
    factory = t.take("factory", str, "")
    if kind not in ("mqtt", "libp2p", "factory"):
        raise ConfigError(f"transport.kind must be mqtt, libp2p or factory, got {show(kind)}")
    if kind == "factory" and (":" not in factory or factory.startswith(":")):
        raise ConfigError("transport.factory must be 'package.module:callable' for kind factory")
    options = dict(t.raw)
    t.raw.clear()
    if kind == "mqtt":
        _mqtt_tls(options, base)
        env = options.pop("password_env", None)
        if env is not None:
            if not isinstance(env, str) or not env:
                raise ConfigError(f"transport.password_env must be a name, got {show(env)}")
            if "password" in options:
                raise ConfigError("transport: set password or password_env, not both")
            options["password"] = _secret_env(env, "transport.password_env")
    plain = {k: v for k, v in options.items() if not isinstance(v, ssl.SSLContext)}
    _check_options(kind, factory if kind == "factory" else ADAPTERS[kind], plain)
    return TransportConfig(kind=kind, factory=factory, options=options)


def _depth(value: object, limit: int) -> bool:
    """Whether ``value`` nests no deeper than ``limit`` (iterative: no RecursionError)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level >= limit:
            return False
        stack.extend((c, level + 1) for c in children)
    return True


def parse_config(data: Mapping[str, Any], base: Path = Path(".")) -> NodeConfig:
    """Build a :class:`NodeConfig` from parsed TOML; ``base`` resolves relative paths."""
    if not _depth(dict(data), MAX_NESTING):
        raise ConfigError(f"tables and arrays nest deeper than {MAX_NESTING} levels")
    top = dict(data)
    replication = parse_replication(top.pop("replication", {}), base)
    store_sync = parse_store_sync(top.pop("store_sync", {}), base)
    collection = parse_collection(top.pop("collection", {}), base)
    bamboo_p2p = parse_bamboo_p2p(top.pop("bamboo_p2p", {}), base)
    sections = {name: Section(name, top.pop(name, {})) for name in _PLAIN_SECTIONS}
    if top:
        names = ", ".join(show(k, 40).strip("'") for k in sorted(top))
        raise ConfigError(f"unknown section(s): {names}")

    a = sections["archive"]
    backend = a.take("backend", str, "sqlite")
    if backend not in ("sqlite", "postgresql"):
        raise ConfigError(f"archive.backend must be sqlite or postgresql, got {show(backend)}")
    path = a.path("path", base, "store.db")
    assert path is not None
    archive = ArchiveConfig(
        backend=backend,
        path=path,
        synchronous=a.take("synchronous", str, "normal").lower(),
        dsn=a.take("dsn", str, ""),
        schema=a.take("schema", str, "chorus_store"),
    )
    if archive.synchronous not in ("normal", "full"):
        raise ConfigError(
            f"archive.synchronous must be normal or full, got {show(archive.synchronous)}"
        )
    if backend == "postgresql" and not archive.dsn:
        raise ConfigError("archive.dsn is required for the postgresql backend")
    if "\x00" in archive.dsn:
        raise ConfigError("archive.dsn contains NUL")
    if not archive.schema.isidentifier() or len(archive.schema) > 63:
        raise ConfigError(f"archive.schema must be an SQL identifier, got {show(archive.schema)}")
    if backend == "sqlite" and not archive.path.parent.is_dir():
        # A typo in the folder must not silently create a new, empty archive elsewhere.
        raise ConfigError(f"archive.path: folder {archive.path.parent} does not exist")
    a.done()

    i = sections["ingest"]
    ingest = IngestConfig(
        channels=channel_ids(i.raw.pop("channels", []), "ingest.channels"),
        batch_size=i.integer("batch_size", _INGEST.batch_size, high=1_000_000),
        batch_interval_ms=i.integer("batch_interval_ms", _INGEST.batch_interval_ms, high=3_600_000),
        queue_size=i.integer("queue_size", _INGEST.queue_size, high=100_000_000),
        queue_bytes=i.integer("queue_bytes", _INGEST.queue_bytes, high=2**40),
        archive_ephemeral=i.take("archive_ephemeral", bool, True),
    )
    i.done()

    transport = _transport(sections["transport"], base)

    g = sections["grpc"]
    grpc = GrpcConfig(
        listen=_listen(g, _GRPC.listen),
        max_request_bytes=g.integer("max_request_bytes", _GRPC.max_request_bytes, 64, _INT32_MAX),
        max_ids_per_request=g.integer(
            "max_ids_per_request", _GRPC.max_ids_per_request, high=100_000
        ),
        default_page_size=g.integer("default_page_size", _GRPC.default_page_size, high=100_000),
        max_page_size=g.integer("max_page_size", _GRPC.max_page_size, high=100_000),
        # Leaves room under gRPC's int32 limit for the framing around a page.
        max_response_bytes=g.integer(
            "max_response_bytes", _GRPC.max_response_bytes, 1024, _INT32_MAX // 2
        ),
        max_concurrent_rpcs=g.integer(
            "max_concurrent_rpcs", _GRPC.max_concurrent_rpcs, high=100_000
        ),
        grants=_grants(g, base),
        tls_cert_file=g.path("tls_cert_file", base, None),
        tls_key_file=g.path("tls_key_file", base, None),
        tls_client_ca_file=g.path("tls_client_ca_file", base, None),
    )
    if (grpc.tls_cert_file is None) != (grpc.tls_key_file is None):
        raise ConfigError("grpc.tls_cert_file and grpc.tls_key_file go together")
    if grpc.tls_client_ca_file is not None and not grpc.tls:
        raise ConfigError("grpc.tls_client_ca_file (mutual TLS) needs tls_cert_file and key")
    for tls_file in (grpc.tls_cert_file, grpc.tls_key_file, grpc.tls_client_ca_file):
        if tls_file is not None and not tls_file.is_file():
            raise ConfigError(f"grpc TLS file {tls_file} does not exist")
    if grpc.default_page_size > grpc.max_page_size:
        # Lowering only max_page_size must not require touching the default too.
        grpc = dataclasses.replace(grpc, default_page_size=grpc.max_page_size)
    g.done()

    m = sections["metrics"]
    metrics = MetricsConfig(listen=_listen(m, _METRICS.listen, allow_empty=True))
    m.done()

    r = sections["retention"]
    max_bytes = r.integer("max_bytes", 0, low=0) if "max_bytes" in r.raw else None
    interval = r.duration("interval_s", 60.0, positive=True)
    assert interval is not None
    retention = RetentionConfig(
        max_age_days=r.duration("max_age_days", None),
        max_bytes=max_bytes,
        interval_s=interval,
    )
    r.done()

    lg = sections["log"]
    level = lg.take("level", str, "info").lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log.level must be debug, info, warning or error, got {show(level)}")
    lg.done()

    config = NodeConfig(
        archive,
        ingest,
        transport,
        grpc,
        metrics,
        retention,
        LogConfig(level),
        replication,
        store_sync,
        collection,
        bamboo_p2p=bamboo_p2p,
    )
    check_listeners(listeners(config))
    return config


#: The sections :func:`parse_config` reads key by key itself.
_PLAIN_SECTIONS = ("archive", "ingest", "transport", "grpc", "metrics", "retention", "log")
#: Every section a configuration file may hold, in the order ``check-config`` lists them:
#: the plain ones, then the stream listeners (each parsed by its own module).
SECTIONS = (*_PLAIN_SECTIONS, "replication", "store_sync", "collection", "bamboo_p2p")

#: Hosts that listen on every address: a port there clashes with the same port anywhere.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


def listeners(config: NodeConfig) -> dict[str, str]:
    """Every address ``store-node serve`` would listen on, by key (``grpc.listen``, ...);
    listeners that are off are left out."""
    found = {
        "grpc.listen": config.grpc.listen,
        "metrics.listen": config.metrics.listen,
        "replication.listen": config.replication.listen,
        "store_sync.listen": config.store_sync.listen,
        "collection.listen": config.collection.listen,
        "bamboo_p2p.listen": config.bamboo_p2p.listen,
    }
    return {key: value for key, value in found.items() if value}


def check_listeners(addresses: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` when two listeners would bind the same port: the same
    host, or one of them on every address (port 0, "any free port", never clashes).
    Found here, ``check-config`` says so instead of ``serve`` failing half-started."""
    seen: list[tuple[str, str, int]] = []
    for key, value in addresses.items():
        host, port = parse_listen(value, key)
        if port == 0:
            continue
        host = "127.0.0.1" if host == "localhost" else host
        for other, other_host, other_port in seen:
            if port == other_port and (
                host == other_host or host in _WILDCARD_HOSTS or other_host in _WILDCARD_HOSTS
            ):
                raise ConfigError(
                    f"{key} {value} and {other} {addresses[other]} are the same port: "
                    "give each listener its own"
                )
        seen.append((key, host, port))


def load_config(path: str | Path) -> NodeConfig:
    """Read and validate a TOML configuration file; any bytes give a one-line ConfigError."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 (byte {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: tables and arrays nest too deeply") from None
    return parse_config(data, path.parent)
