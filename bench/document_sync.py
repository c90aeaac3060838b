"""Per-document sync of a long history: loose commits vs sedimentree strata vs RBSR.

One document with ``N`` operations (10,000; ``--quick`` 2,000) at the store
node, in a real document store; the phone holds the first ``N - k`` of them
(k = 1, 10, 100, 1000). Each method brings the phone's copy (a fresh copy of
its SQLite file per method) up to date, every operation validated and stored:

* ``loose``: ``fetch_sedimentree`` lists every operation as a loose commit,
  then the missing operations are fetched (``CollectionConfig(strata=False)``);
* ``strata``: the same with strata (``sdk/sync/collection/sedimentree.py``):
  strata the phone holds are skipped, the others fetched as bundles;
* ``rbsr``: the replication issue's range-based set reconciliation
  (``sdk.sync.rbsr.Reconciler``, branching 4, threshold 8) over the
  document's operation hashes, then the missing operations fetched as in
  ``loose``. Its bytes are counted with a stated encoding (the Beelay grammar
  has no such message): 1 type byte per range message, 32-byte keys and
  bounds, 16-byte fingerprints.

Figures (JSON lines, also appended to ``bench/results/document_sync.jsonl``),
tags ``n``, ``k``, ``method``: ``document.bytes`` (both ways, until the phone
holds every operation), ``document.round_trips``, ``document.cpu_seconds``
(both sides, in process, encoding and ingest included).

Usage: ``python bench/document_sync.py [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import Recorder
from sdk.documents import DocumentStore, KeyPair, Published
from sdk.sync import rbsr
from sdk.sync.collection import CollectionConfig, CollectionServer, document_key, encode_message
from sdk.sync.collection.messages import FetchBlobPartRequest, Request
from sdk.sync.collection.pull import DocumentPull, ingest_operation_blob
from sdk.sync.collection.sedimentree import operation_digest, operation_id_of
from tests.sync.collection_fixtures import FOLDER, build_collection, rename

HASH = 32
FINGERPRINT = 16


def open_store(path: Path) -> DocumentStore:
    store = DocumentStore(str(path))
    store.add_schema(FOLDER)
    return store


def new_ids() -> itertools.count[int]:
    return itertools.count(1)


def pull_method(server: CollectionServer, phone: DocumentStore, root: str) -> tuple[int, int]:
    """``(bytes, round trips)`` of a DocumentPull."""
    ids = new_ids()
    pull = DocumentPull(phone, document_key(root), new_id=lambda: next(ids).to_bytes(16, "big"))
    requests = [pull.start()]
    wire = trips = 0
    while requests:
        trips += 1
        answers = [server.handle("phone", r, 0) for r in requests]
        wire += sum(len(encode_message(r)) for r in requests)
        wire += sum(len(encode_message(a)) for a in answers)
        requests = [nxt for a in answers for nxt in pull.receive(a)]
    return wire, trips


def message_bytes(message: rbsr.RangeMessage) -> int:
    """Bytes of one range message in the stated encoding."""
    if isinstance(message, rbsr.Fingerprint):
        return 1 + FINGERPRINT + HASH
    if isinstance(message, rbsr.Payload):
        return 1 + HASH + (0 if message.upper_bound is None else 1 + HASH)
    if isinstance(message, rbsr.EmptySet | rbsr.Terminal):
        return 1 + (1 if isinstance(message, rbsr.EmptySet) else 0)
    return 1 + HASH  # LowerBound, EmptyPayload, Done


def index_of(keys: list[bytes]) -> rbsr.RangeIndex:
    index = rbsr.RangeIndex(rbsr.MemoryNodeStore())
    index.update(inserts=sorted(keys))
    return index


def rbsr_method(
    server: CollectionServer, phone: DocumentStore, root: str, server_order: list[str]
) -> tuple[int, int]:
    """``(bytes, round trips)``: reconcile the operation hashes, then fetch what is missing."""
    theirs = rbsr.Reconciler(index_of([operation_digest(o) for o in server_order]))
    ours = rbsr.Reconciler(index_of([operation_digest(r.id) for r in phone.operations(root)]))
    round_ = ours.initiate()
    wire, trips, turn = sum(map(message_bytes, round_)), 0, theirs
    while not turn.finished:
        answer = turn.receive_round(round_)
        trips += turn is theirs
        if not answer:
            break
        wire += sum(map(message_bytes, answer))
        round_, turn = answer, (ours if turn is theirs else theirs)
    _, missing = ours.take_differences()
    missing_set = set(missing)
    wanted = [o for o in server_order if operation_digest(o) in missing_set]
    if wanted:
        trips += 1
        ids = new_ids()
        for operation_id in wanted:
            request = Request(
                next(ids).to_bytes(16, "big"),
                FetchBlobPartRequest(operation_digest(operation_id), 0, 1 << 20),
            )
            answer_ = server.handle("phone", request, 0)
            wire += len(encode_message(request)) + len(encode_message(answer_))
            data = answer_.body.data  # type: ignore[union-attr]
            ingest_operation_blob(phone, data, operation_id_of(operation_digest(operation_id)))
    return wire, trips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="2,000 operations instead of 10,000")
    args = parser.parse_args()
    n = 2000 if args.quick else 10_000
    recorder = Recorder("document_sync")
    folder = Path(tempfile.mkdtemp(prefix="chorus-document-sync-"))
    key = KeyPair.from_private_key(bytes([5]) * 32)
    node = open_store(folder / "node.db")
    t0 = time.perf_counter()
    root = build_collection([node], key, 1).root
    created = node.operations(root)[0]
    stored = node.entry(created.id)
    assert stored is not None
    ops = [Published(stored[0], stored[1], created.id, root, ())]
    ops += [rename([node], key, root, f"title {i}") for i in range(n - 1)]
    print(f"# built {n} operations in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    server_order = [r.id for r in node.operations(root)]
    ks = [k for k in (1000, 100, 10, 1) if k < n]
    base = open_store(folder / "phone.db")
    held = 0
    for k in ks:
        for op in ops[held : n - k]:
            base.ingest(op.entry, op.operation)
        held = n - k
        for method in ("loose", "strata", "rbsr"):
            copy = folder / f"phone-{method}.db"
            shutil.copy(folder / "phone.db", copy)
            phone = open_store(copy)
            phone.operations(root)  # load the document before timing
            start = time.process_time()
            if method == "rbsr":
                wire, trips = rbsr_method(CollectionServer(node), phone, root, server_order)
            else:
                config = CollectionConfig(strata=method == "strata")
                wire, trips = pull_method(CollectionServer(node, config), phone, root)
            seconds = time.process_time() - start
            assert [r.id for r in phone.operations(root)] == server_order
            phone.close()
            tags = {"n": n, "k": k, "method": method}
            recorder.record("document.bytes", wire, "bytes", **tags)
            recorder.record("document.round_trips", trips, "round trips", **tags)
            recorder.record("document.cpu_seconds", seconds, "s", **tags)
    base.close()
    node.close()
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
