"""Store-to-store sync: store nodes of the same channels reconcile their archives.

A node that was down heals its gaps from a peer: range-based set reconciliation
(:mod:`sdk.sync.rbsr`) over sync keys ``(timestamp, message hash)`` kept in a
range index persisted in the archive, then the missing messages, pushed both
ways and ingested like live ones. ``docs/store-node.md`` ("Store-to-store sync")
describes it for operators.

=================================== ===================================================
module                              what
=================================== ===================================================
:mod:`store_node.store_sync.config` the ``[store_sync]`` section
:mod:`store_node.store_sync.wire`   the messages and their bounded decoder
:mod:`store_node.store_sync.index`  sync keys, the archive's persisted range index
:mod:`store_node.store_sync.machine` the protocol, a sans-I/O machine
:mod:`store_node.store_sync.session` one session: the machine on a stream and an archive
:mod:`store_node.store_sync.service` the node's service: listener, peers, indexer
=================================== ===================================================

Submodules are imported directly (this package imports nothing, so
:mod:`store_node.config` can import the config module without a cycle).
"""
