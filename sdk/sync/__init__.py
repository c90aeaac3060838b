"""The sync layer: how a peer that was away catches up.

``rbsr`` is range-based set reconciliation over any totally ordered byte keys
(fingerprints from a lifting monoid over XXH3-128, an O(log n) persisted
index). The p2panda replication protocol builds on it.
"""

from __future__ import annotations
