"""Fuzz targets: every decoder that takes bytes from a peer or a file.

Each :class:`Target` pairs a decoder with the only exceptions it may raise on
any input (its package's typed error for bad input) and a seed corpus of valid
inputs built with the project's own encoders, so mutations reach deep into the
format. Anything else escaping is a bug. The sync layer's decoders may raise only
``sdk.sync.errors.RemoteProtocolError`` (one tree for the whole layer: malformed bytes
and peer-controlled sizes over their bounds alike). ``tests/fuzz/test_fuzz.py`` runs them
under hypothesis with a small budget on every CI run; ``scripts/fuzz``
(``tests/fuzz/run.py``) runs a million or more mutated inputs per target.

========================== ================================================ ===================
target                     decoder                                          may raise
========================== ================================================ ===================
``sds_message``            ``sdk.sds.message.decode_message``               ``RemoteProtocolError``
``store_ingest``           ``store_node.ingest.row_from_envelope``          nothing (a reason)
``bamboo_entry``           ``sdk.documents.bamboo.decode_entry``            ``MalformedInput``
``cbor``                   ``sdk.documents.cbor.decode``                    ``MalformedInput``
``operation``              ``sdk.documents.operation.decode_operation``     ``MalformedInput``
``document_payload``       ``sdk.documents.channel.decode_payload``         ``MalformedInput``
``document_channel``       ``DocumentChannel.on_delivered`` (validates,     nothing (events)
                           stores, materializes)
``grpc_request``           ``StoreQueryRequest.FromString`` + ``plan_query`` ``DecodeError``, ``InvalidQuery``
``store_config``           ``store_node.config.load_config`` (a file)       ``ConfigError``
``store_sync_wire``        ``store_node.store_sync.wire.decode``            ``MalformedMessage``
``sync_message``           ``sdk.sync.messages.decode`` (with and without   sync ``RemoteProtocolError``
                           a ``RoundContext``)
``collection_message``     ``sdk.sync.collection.decode_message``           sync ``RemoteProtocolError``
``bamboo_p2p_control``     ``sdk.sync.bamboo_p2p.codec.decode_all_control`` sync ``RemoteProtocolError``
``bamboo_p2p_data``        ``decode_data`` to the end (backlinks both ways) sync ``RemoteProtocolError``
``bamboo_p2p_lzfoo``       ``lzfoo.Decompressor.decompress`` (window 4096)  ``CompressionViolation``
``sealed_envelope``        ``sdk.encryption.ChannelEncryption.decrypt``     ``RemoteEncryptionError``
``key_package``            ``sdk.encryption.KeyRing.accept``                ``RemoteEncryptionError``
========================== ================================================ ===================
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from sdk._proto.store.v1 import store_pb2
from sdk.documents import DocumentChannel, DocumentStore
from sdk.documents.bamboo import decode_entry
from sdk.documents.cbor import decode as cbor_decode
from sdk.documents.cbor import encode as cbor_encode
from sdk.documents.channel import decode_payload
from sdk.documents.errors import MalformedInput
from sdk.documents.keys import KeyPair
from sdk.documents.operation import decode_operation
from sdk.encryption import RemoteEncryptionError
from sdk.sds.errors import RemoteProtocolError
from sdk.sds.message import HistoryEntry, Message, decode_message, encode_message
from sdk.sync import messages as sync_messages
from sdk.sync import rbsr
from sdk.sync.bamboo_p2p.codec import decode_all_control, decode_data
from sdk.sync.collection import decode_message as decode_collection_message
from sdk.sync.errors import MalformedMessage
from sdk.sync.errors import RemoteProtocolError as SyncRemoteProtocolError
from store_node.config import load_config
from store_node.cursor import CursorCodec
from store_node.errors import ConfigError, InvalidQuery
from store_node.ingest import row_from_envelope
from store_node.query import QueryLimits, plan_query
from store_node.store_sync import wire as store_sync_wire
from tests.encryption import fuzz_targets as sealed
from transports.base import Envelope, message_hash, topic_for_channel

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Target:
    """One decoder under fuzz."""

    name: str
    #: Feeds one input; raises only ``allowed`` on bad input.
    run: Callable[[bytes], object]
    allowed: tuple[type[BaseException], ...]
    seeds: tuple[bytes, ...]


# ---------------------------------------------------------------- seeds


def sds_seeds() -> tuple[bytes, ...]:
    """Valid SDS messages of every kind, with histories, filters, repair requests."""
    history = tuple(HistoryEntry(f"id{i}", bytes([i]) * 32, f"s{i}") for i in range(4))
    return tuple(
        encode_message(m)
        for m in (
            Message("alice", "m1", "room", 1_700_000_000_000, content=b"hello"),
            Message("bob", "m2", "room", 5, history, b"\x01" * 64, b"text"),
            Message("carol", "m3", "room", 7, history),  # sync
            Message("dave", "m4", "room", None, content=b"typing"),  # ephemeral
            Message("erin", "m5", "r/x", 9, history[:1], None, b"x", history[1:3]),
        )
    )


def _document_payloads() -> tuple[tuple[bytes, ...], DocumentChannel]:
    key = KeyPair.from_private_key(bytes(range(32)))
    docs = DocumentChannel(DocumentStore(), key)
    payloads, schema = docs.define_schema(
        "todo", "A todo item", {"title": "str", "done": "bool", "n": "int", "w": "float"}
    )
    created, event = docs.create(schema.id, {"title": "milk", "done": False, "n": 1, "w": 0.5})
    updated, _ = docs.update(event.document_id, {"done": True})
    deleted, _ = docs.delete(event.document_id)
    return (*payloads, created, updated, deleted), docs


_DOCUMENTS: tuple[bytes, ...] | None = None


def document_seeds() -> tuple[bytes, ...]:
    """Framed ``[entry, operation]`` payloads: schema definitions, CREATE, UPDATE, DELETE."""
    global _DOCUMENTS
    if _DOCUMENTS is None:
        _DOCUMENTS = _document_payloads()[0]
    return _DOCUMENTS


def entry_seeds() -> tuple[bytes, ...]:
    """Signed Bamboo entries (the first element of each document payload)."""
    return tuple(decode_payload(p)[0] for p in document_seeds())


def operation_seeds() -> tuple[bytes, ...]:
    """p2panda operations (the second element of each document payload)."""
    return tuple(decode_payload(p)[1] for p in document_seeds())


def cbor_seeds() -> tuple[bytes, ...]:
    """Operations plus CBOR values of every major type the codec handles."""
    values: list[object] = [
        0,
        -1,
        2**63 - 1,
        -(2**63),
        1.5,
        1e300,
        "x",
        b"\x00",
        [1, [2]],
        {"a": 1},
    ]
    return operation_seeds() + tuple(cbor_encode(v) for v in values)  # type: ignore[arg-type]


def grpc_seeds() -> tuple[bytes, ...]:
    """Store queries: lookups by id and hash, time ranges, with cursors and limits."""
    return tuple(
        r.SerializeToString()
        for r in (
            store_pb2.StoreQueryRequest(channel_id="room", message_ids=["a", "b"]),
            store_pb2.StoreQueryRequest(message_hashes=[b"\x01" * 32], include_data=True),
            store_pb2.StoreQueryRequest(
                channel_id="room",
                time_start=1,
                time_end=2**40,
                pagination_forward=True,
                pagination_limit=50,
            ),
        )
    )


def config_seeds() -> tuple[bytes, ...]:
    """The example configuration and small valid variants."""
    example = (ROOT / "examples" / "store_node.toml").read_bytes()
    return (
        example,
        b'[ingest]\nchannels = ["a", "b"]\nbatch_size = 10\n',
        b'[archive]\nbackend = "postgresql"\ndsn = "postgresql://x"\n[retention]\nmax_age_days = 1.5\n',
        b'[grpc]\nlisten = "127.0.0.1:1"\nmax_page_size = 7\n[log]\nlevel = "debug"\n',
    )


def store_sync_seeds() -> tuple[bytes, ...]:
    """One store-sync message of each type, every range-message tag included."""
    key, bound = bytes(range(40)), bytes(range(1, 41))
    ranges = (
        rbsr.EmptySet(True),
        rbsr.LowerBound(key),
        rbsr.Payload(key),
        rbsr.Payload(key, True, bound),
        rbsr.EmptyPayload(bound),
        rbsr.Done(bound),
        rbsr.Fingerprint(b"\x05" * 16, bound),
        rbsr.Terminal(),
    )
    return (
        store_sync_wire.encode(store_sync_wire.Hello()),
        store_sync_wire.encode(store_sync_wire.Ranges(ranges)),
        store_sync_wire.encode(store_sync_wire.Messages((("room", sds_seeds()[0]),))),
        store_sync_wire.encode(store_sync_wire.Finished()),
    )


def sync_seeds() -> tuple[bytes, ...]:
    """The replication messages aquadoggo encodes (``tests/sync/aquadoggo_vectors.json``)
    and a set-reconciliation round in the compact forms (same-author items, bare prefixes)."""
    from tests.sync.test_messages import COMPACT_ROUNDS

    vectors = json.loads((ROOT / "tests" / "sync" / "aquadoggo_vectors.json").read_text())
    context = sync_messages.RoundContext()
    compact = [
        sync_messages.encode(sync_messages.RangeSync(5, m), context) for m, _ in COMPACT_ROUNDS
    ]
    return (*(bytes.fromhex(v["cbor_hex"]) for v in vectors["vectors"]), *compact)


def collection_seeds() -> tuple[bytes, ...]:
    """Every collection-sync message vector written from the Beelay grammar."""
    from tests.sync.test_collection_messages import VECTORS

    return tuple(wire for _, _, wire in VECTORS)


def bamboo_control_seeds() -> tuple[bytes, ...]:
    """Every control-channel vector written from the point-to-point spec."""
    from tests.sync.test_bamboo_p2p_codec import CONTROL_VECTORS

    return tuple(bytes.fromhex(hex_bytes) for _, _, hex_bytes in CONTROL_VECTORS)


def bamboo_data_seeds() -> tuple[bytes, ...]:
    """Every data-channel vector written from the point-to-point spec."""
    from tests.sync.test_bamboo_p2p_codec import DATA_VECTORS

    return tuple(bytes.fromhex(hex_bytes) for _, _, hex_bytes in DATA_VECTORS)


def lzfoo_seeds() -> tuple[bytes, ...]:
    """Compressor outputs behind a 2-byte declared length (what ``_lzfoo`` reads)."""
    from sdk.sync.bamboo_p2p.lzfoo import Compressor

    seeds = []
    for text in (b"", b"abcabcabcabc", b"the lazy dog " * 30, bytes(range(256)) * 3):
        seeds.append(len(text).to_bytes(2, "big") + Compressor(4096).compress(text))
    return tuple(seeds)


# ---------------------------------------------------------------- runners


def _lzfoo(data: bytes) -> object:
    """Decompress ``data[2:]`` into the length the first two bytes declare."""
    from sdk.sync.bamboo_p2p.lzfoo import Decompressor

    if len(data) < 2:
        return None
    return Decompressor(4096).decompress(data[2:], int.from_bytes(data[:2], "big"))


def _bamboo_data(data: bytes) -> object:
    """Decode data messages to the end, metadata read without a backlink, else with one."""

    def decode_all(backlink: bool) -> int:
        pos = 0
        while pos < len(data):
            _, pos = decode_data(data, pos, lambda: backlink)
        return pos

    try:
        return decode_all(False)
    except SyncRemoteProtocolError:
        return decode_all(True)


def _sync_message(data: bytes) -> object:
    """Decode without a context, then with one that holds a public key for sessions 0-7
    (so same-author items resolve)."""
    with contextlib.suppress(SyncRemoteProtocolError):
        sync_messages.decode(data)
    context = sync_messages.RoundContext()
    for session_id in range(8):
        context.note(session_id, b"\x0a" * 32)
    return sync_messages.decode(data, context)


def _store_ingest(data: bytes) -> object:
    topic = topic_for_channel("room")
    return row_from_envelope(Envelope(topic, data, message_hash(topic, data)), 1)


_CODEC = CursorCodec(b"\x07" * 32)
_LIMITS = QueryLimits(max_ids_per_request=50, default_page_size=20, max_page_size=100)


def _grpc(data: bytes) -> object:
    return plan_query(store_pb2.StoreQueryRequest.FromString(data), _LIMITS, _CODEC)


class _DocumentChannelTarget:
    """A document channel that already holds the seeds' schema; a fresh one every
    ``reset_every`` inputs so stored state cannot grow without bound."""

    reset_every = 2000

    def __init__(self) -> None:
        self._docs: DocumentChannel | None = None
        self._count = 0

    def __call__(self, data: bytes) -> object:
        if self._docs is None or self._count % self.reset_every == 0:
            self._docs = DocumentChannel(
                DocumentStore(), KeyPair.from_private_key(bytes(range(1, 33)))
            )
            for payload in document_seeds()[:-1]:
                self._docs.on_delivered(payload)
        self._count += 1
        return self._docs.on_delivered(data)


class _ConfigTarget:
    """Writes each input to a file (the loader's real input) and loads it."""

    def __init__(self) -> None:
        shm = Path("/dev/shm")
        folder = tempfile.mkdtemp(prefix="chorus-fuzz-", dir=shm if shm.is_dir() else None)
        self.path = Path(folder) / "store.toml"

    def __call__(self, data: bytes) -> object:
        self.path.write_bytes(data)
        return load_config(self.path)

    def cleanup(self) -> None:
        """Remove the scratch file."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self.path.parent)


def all_targets() -> list[Target]:
    """Every target, with fresh state."""
    return [
        Target("sds_message", decode_message, (RemoteProtocolError,), sds_seeds()),
        Target("store_ingest", _store_ingest, (), sds_seeds()),
        Target("bamboo_entry", decode_entry, (MalformedInput,), entry_seeds()),
        Target("cbor", cbor_decode, (MalformedInput,), cbor_seeds()),
        Target("operation", decode_operation, (MalformedInput,), operation_seeds()),
        Target("document_payload", decode_payload, (MalformedInput,), document_seeds()),
        Target("document_channel", _DocumentChannelTarget(), (), document_seeds()),
        Target("grpc_request", _grpc, (DecodeError, InvalidQuery), grpc_seeds()),
        Target("store_config", _ConfigTarget(), (ConfigError,), config_seeds()),
        Target("store_sync_wire", store_sync_wire.decode, (MalformedMessage,), store_sync_seeds()),
        Target("sync_message", _sync_message, (SyncRemoteProtocolError,), sync_seeds()),
        Target(
            "collection_message",
            decode_collection_message,
            (SyncRemoteProtocolError,),
            collection_seeds(),
        ),
        Target(
            "bamboo_p2p_control",
            decode_all_control,
            (SyncRemoteProtocolError,),
            bamboo_control_seeds(),
        ),
        Target("bamboo_p2p_data", _bamboo_data, (SyncRemoteProtocolError,), bamboo_data_seeds()),
        Target("bamboo_p2p_lzfoo", _lzfoo, (SyncRemoteProtocolError,), lzfoo_seeds()),
        Target(
            "sealed_envelope",
            sealed.open_envelope,
            (RemoteEncryptionError,),
            sealed.envelope_seeds(),
        ),
        Target(
            "key_package",
            sealed.accept_key_package,
            (RemoteEncryptionError,),
            sealed.key_package_seeds(),
        ),
    ]


def check(target: Target, data: bytes) -> BaseException | None:
    """Run ``target`` on ``data``; return an exception it must not raise, else ``None``."""
    try:
        target.run(data)
    except target.allowed:
        return None
    except RecursionError as exc:  # a subclass of RuntimeError, called out: depth bugs
        return exc
    except Exception as exc:
        return exc
    return None


# ---------------------------------------------------------------- mutation

_INTERESTING = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\xc0\x80", b"\xed\xa0\x80", b"[", b'"', b"\\")


def mutate(seeds: tuple[bytes, ...], rng: random.Random) -> bytes:
    """One input: a seed changed by 1-8 random edits (bit flips, interesting bytes,
    insertions, deletions, duplicated or spliced ranges, truncation), or random bytes."""
    if rng.random() < 0.05:
        return rng.randbytes(rng.randrange(0, 512))
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        n = len(data)
        if op == 0 and n:
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            data[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:
            at = rng.randrange(n + 1)
            data[at:at] = (
                rng.choice(_INTERESTING) if rng.random() < 0.5 else rng.randbytes(rng.randint(1, 8))
            )
        elif op == 3 and n:
            at = rng.randrange(n)
            del data[at : at + rng.randint(1, 16)]
        elif op == 4 and n:
            at = rng.randrange(n)
            chunk = data[at : at + rng.randint(1, 64)]
            to = rng.randrange(n + 1)
            data[to:to] = chunk * rng.randint(1, 4)
        elif op == 5:
            other = rng.choice(seeds)
            if other:
                at = rng.randrange(len(other))
                data[rng.randrange(n + 1) :] = other[at:]
        elif op == 6 and n:
            del data[rng.randrange(n) :]
    return bytes(data)
