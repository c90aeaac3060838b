"""Benchmark of collection sync (RIBLT snapshots, Beelay messages) against the naive baseline.

A store node and a phone hold the same collection of ``n`` linked documents (a
tree of folders, 10,000; ``--quick`` 1,000), in real document stores. Then
``d`` documents (1, 10, 100, 1000) are edited at the store node and the phone
asks which documents of the collection are out of sync. Every changed document
is two differing RIBLT items (its old state on the phone, its new one at the
store node). Figures, one JSON object per line (also appended to
``bench/results/collection_sync.jsonl``), tags ``n``, ``d``:

* ``collection.symbols_per_diff``: coded symbols the decoder needed, fed one at
  a time, per differing item (target <= 1.6 at d >= 100; paper: 1.35).
* ``collection.round_trips``: requests until the phone knows the out-of-sync set
  (target <= 2 for d <= 100), tag ``history``: ``warm`` when the store node
  remembers the phone's previous snapshot (a device reconnecting to its own
  store node), ``cold`` when it does not.
* ``collection.riblt_bytes`` / ``collection.naive_bytes``: bytes both ways to
  know the set. Naive baseline: the phone sends every document's id and view
  id (34 bytes each, p2panda's binary hashes), the store node answers with the
  ids and view ids of those that differ.
* ``collection.naive_over_riblt_bytes``: their ratio, same run (target >= 50 at
  d = 10), per ``history``.
* ``collection.seconds_to_identify``: seconds until the set is known,
  ``method`` ``riblt`` or ``naive``: CPU seconds of both sides for the naive
  baseline and the cold session (in process, messages encoded and decoded,
  tag ``transport``: ``in-process``), wall seconds of the warm session over
  TCP (``transport``: ``tcp``; both sides share this process).
* ``collection.seconds_to_sync``, ``collection.sync_round_trips``,
  ``collection.sync_bytes`` (tag ``transport``: ``tcp``): the real service over
  a TCP loopback stream (``CollectionService``, the phone's
  ``CollectionConnection``, framing included), warm: the phone connects,
  learns the set, pulls every out-of-sync document (``fetch_sedimentree``,
  then the missing operations, each validated and stored) until it holds what
  the store node holds; wall seconds from connecting to done, both sides in
  this one process (``collection.cpu_seconds_to_sync``: the CPU seconds of
  the same, both sides; on a shared machine the wall time also counts other
  processes). ``collection.seconds_to_pull`` is the pull phase alone,
  which is the same whichever way the set was found: the naive baseline's
  total is its ``seconds_to_identify`` plus that. The warm ``round_trips``
  and ``riblt_bytes`` are those of this TCP session (frame prefixes included).

Usage: ``python bench/collection_sync.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.documents import DocumentStore, KeyPair
from sdk.sync.collection import (
    DOC_AND_STATE,
    CollectionServer,
    CollectionService,
    SnapshotSync,
    connect_collection,
    decode_message,
    document_key,
    encode_message,
    reachable_documents,
)
from sdk.sync.collection.messages import Request, Response
from sdk.sync.collection.symbols import document_item
from sdk.sync.riblt import Decoder, Encoder
from tests.sync.collection_fixtures import build_collection, new_sync_store, rename

HASH_BYTES = 34


def riblt_session(
    server: CollectionServer, phone: DocumentStore, root: str
) -> tuple[int, int, int, float]:
    """``(round trips, bytes, out-of-sync documents, CPU seconds)`` of one session."""
    ids = itertools.count(1)
    start = time.process_time()
    session = SnapshotSync(phone, root, server.config, new_id=lambda: next(ids).to_bytes(16, "big"))
    request: Request | None = session.start()
    total = 0
    while request is not None:
        wire = encode_message(request)
        answer = encode_message(server.handle("phone", request, 0))
        total += len(wire) + len(answer)
        response = decode_message(answer)
        assert isinstance(response, Response)
        request = session.receive(response)
    seconds = time.process_time() - start
    assert session.result is not None
    out_of_sync = len(session.result.changed) + len(session.result.missing)
    return session.round_trips, total, out_of_sync, seconds


def naive_session(server: DocumentStore, phone: DocumentStore, root: str) -> tuple[int, int, float]:
    """``(bytes, out-of-sync documents, CPU seconds)`` of the naive baseline."""
    start = time.process_time()
    views = reachable_documents(phone, root, 10**7)
    request = b"".join(
        bytes.fromhex(v.document_id) + b"".join(bytes.fromhex(o) for o in v.view_id) for v in views
    )
    theirs = {v.document_id: v.view_id for v in reachable_documents(server, root, 10**7)}
    ours = {v.document_id: v.view_id for v in views}
    differing = [d for d, view in theirs.items() if ours.get(d) != view]
    response = sum(HASH_BYTES * (1 + len(theirs[d])) for d in differing)
    return len(request) + response, len(differing), time.process_time() - start


def symbols_needed(server: DocumentStore, phone: DocumentStore, root: str) -> tuple[int, int]:
    """``(coded symbols needed fed one at a time, differing items)``."""
    theirs = [
        document_item(v.document_id, v.view_id) for v in reachable_documents(server, root, 10**7)
    ]
    ours = [
        document_item(v.document_id, v.view_id) for v in reachable_documents(phone, root, 10**7)
    ]
    encoder = Encoder(DOC_AND_STATE, theirs)
    decoder = Decoder(DOC_AND_STATE, ours)
    while not decoder.add_symbols([encoder.produce()]):
        pass
    return decoder.symbols_received, decoder.difference_size


async def tcp_catch_up(port: int, phone: DocumentStore, root: str) -> dict[str, float]:
    """One catch-up over TCP: identify, then pull; wall seconds, round trips, bytes."""
    start, cpu_start = time.perf_counter(), time.process_time()
    async with await connect_collection(phone, "127.0.0.1", port) as connection:
        session = SnapshotSync(phone, root, connection.config)
        request: Request | None = session.start()
        while request is not None:
            request = session.receive(await connection.request(request))
        identified = time.perf_counter()
        identify_bytes = connection.stats.bytes_sent + connection.stats.bytes_received
        result = session.result
        assert result is not None
        keys = [document_key(d) for d in result.changed] + list(result.missing)
        applied = await connection.pull(keys)
        done, cpu_done = time.perf_counter(), time.process_time()
        total_bytes = connection.stats.bytes_sent + connection.stats.bytes_received
    return {
        "identify_round_trips": session.round_trips,
        "identify_bytes": identify_bytes,
        "identify_seconds": identified - start,
        "pull_seconds": done - identified,
        "seconds": done - start,
        "cpu_seconds": cpu_done - cpu_start,
        # fetch_sedimentree for every document at once, then every missing operation.
        "round_trips": session.round_trips + (2 if keys else 0),
        "bytes": total_bytes,
        "changed": len(result.changed),
        "applied": applied,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="1,000 documents instead of 10,000")
    args = parser.parse_args()
    asyncio.run(run(args))


async def run(args: argparse.Namespace) -> None:
    """Every figure of the docstring, for one n."""
    n = 1000 if args.quick else 10_000
    recorder = Recorder("collection_sync")
    key = KeyPair.from_private_key(bytes(range(32)))
    editor = KeyPair.from_private_key(bytes(range(1, 33)))
    server_store, phone = new_sync_store(), new_sync_store()
    t0 = time.perf_counter()
    collection = build_collection([server_store, phone], key, n)
    print(
        f"# built {n} documents in two stores in {time.perf_counter() - t0:.1f} s", file=sys.stderr
    )
    root = collection.root
    service = CollectionService(server_store)
    port = await service.start()
    await tcp_catch_up(port, phone, root)  # the phone's previous visit, in sync
    edited = 0
    for d in (1, 10, 100, 1000):
        if d > n // 2:
            continue
        published = [
            rename([server_store], editor, collection.documents[edited + i], f"edit {d}")
            for i in range(d)
        ]
        edited += d
        tags = {"n": n, "d": d}
        symbols, items = symbols_needed(server_store, phone, root)
        recorder.record(
            "collection.symbols_per_diff", symbols / items, "symbols/item", items=items, **tags
        )
        naive_bytes, naive_found, naive_s = naive_session(server_store, phone, root)
        recorder.record("collection.naive_bytes", naive_bytes, "bytes", **tags)
        recorder.record("collection.seconds_to_identify", naive_s, "s", method="naive", **tags)
        cold = riblt_session(CollectionServer(server_store), phone, root)
        done = await tcp_catch_up(port, phone, root)  # warm: identify, then pull
        assert done["applied"] == len(published) and done["changed"] == d
        warm = (done["identify_round_trips"], done["identify_bytes"], d, done["identify_seconds"])
        runs = (("cold", "in-process", cold), ("warm", "tcp", warm))
        for history, transport, (trips, riblt_bytes, found, seconds) in runs:
            assert found == naive_found == d, (found, naive_found, d)
            run_tags = {"history": history, "transport": transport, **tags}
            recorder.record("collection.round_trips", trips, "round trips", **run_tags)
            recorder.record("collection.riblt_bytes", riblt_bytes, "bytes", **run_tags)
            ratio = naive_bytes / riblt_bytes
            recorder.record("collection.naive_over_riblt_bytes", ratio, "ratio", **run_tags)
            recorder.record(
                "collection.seconds_to_identify", seconds, "s", method="riblt", **run_tags
            )
        tcp = {"transport": "tcp", **tags}
        recorder.record("collection.seconds_to_sync", done["seconds"], "s", method="riblt", **tcp)
        recorder.record(
            "collection.cpu_seconds_to_sync", done["cpu_seconds"], "s", method="riblt", **tcp
        )
        recorder.record("collection.seconds_to_pull", done["pull_seconds"], "s", **tcp)
        recorder.record("collection.sync_round_trips", done["round_trips"], "round trips", **tcp)
        recorder.record("collection.sync_bytes", done["bytes"], "bytes", **tcp)
    await service.close()


if __name__ == "__main__":
    main()
