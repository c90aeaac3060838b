"""The sync layer: how a peer that was away catches up.

p2panda replication (``specs/p2panda-replication.txt``) between two document
stores over a reliable stream: Announce, SyncRequest, range-based set
reconciliation or Log-Height, Entry, SyncDone and live mode; and, on the same
driver, collection sync and Bamboo point-to-point.

Module map:

* ``rbsr``: range-based set reconciliation over any totally ordered byte keys:
  ``rbsr.monoid`` (fingerprints from a lifting monoid over XXH3-128),
  ``rbsr.index`` (the O(log n) range index), ``rbsr.node_store`` (where its
  nodes live: memory, or one SQL store with a dialect per database),
  ``rbsr.messages`` (range messages), ``rbsr.reconciler`` (the rounds);
* ``riblt``: rateless invertible Bloom lookup tables (collection sync's snapshots);
* ``messages``: the CBOR messages (aquadoggo's bytes for types 0-3 and 10);
* ``session``: :class:`Replication`, the session manager of one peer connection,
  a pure machine of ``machine``'s shape (bytes in and out, store work out as
  requests), with both strategies (set reconciliation and Log-Height); ``send_plan``:
  what a session sends, planned in chunks and read as they go; ``session_state``:
  a session's state, :class:`SyncConfig` and the requests;
* ``store``: :class:`SyncStore`, a document store with per-schema range indexes;
  ``store_work``: replication's requests carried out on it;
* ``framing``: one length-prefixed frame per message; ``fields``: :class:`FieldReader`
  and the field kinds the collection and store-sync formats are tables of;
* ``driver``: replication over a :class:`transports.stream.Stream` (:func:`sync`,
  :func:`serve_stream`, :class:`SyncConnection`), on ``run``;
* ``machine``: :class:`~sdk.sync.machine.Machine`, the one shape of a sync
  protocol machine; ``run``: :func:`~sdk.sync.run.run_machine`, the asyncio
  driver for any machine over any stream (replication, store-to-store sync,
  collection sync and Bamboo run on it);
* ``collection``: collection sync (Beelay); ``bamboo_p2p``: Bamboo point-to-point
  (``docs/bamboo-p2p.md``);
* ``announce``: Announce over the pub/sub transports (one state per peer);
* ``__main__``: ``python -m sdk.sync``, serve or sync a document store over TCP;
* ``events``, ``errors``: what a session reports and its exception tree (imported
  from there; the package exports the entry points above).
"""

from __future__ import annotations

from sdk.sync.driver import SyncConnection, serve_stream, sync
from sdk.sync.framing import WireStats
from sdk.sync.messages import Announce, Mode
from sdk.sync.session import Replication, SyncConfig
from sdk.sync.store import StoredEntry, SyncStore

__all__ = [
    "Announce",
    "Mode",
    "Replication",
    "StoredEntry",
    "SyncConfig",
    "SyncConnection",
    "SyncStore",
    "WireStats",
    "serve_stream",
    "sync",
]
