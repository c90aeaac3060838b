"""Range-based set reconciliation over totally ordered byte keys.

Theory of operation
-------------------
Two peers each hold a set of keys (``bytes``, compared lexically). They find
the symmetric difference by comparing *fingerprints* of key ranges and
splitting the ranges that differ (Meyer, "Range-Based Set Reconciliation",
2022; the same scheme as earthstar's range-reconcile, iroh's ranger and
negentropy). Nothing here knows about p2panda: the replication session
(:mod:`sdk.sync.session`) maps its ``(public_key, log_id, seq_num)`` items to
keys, and store-to-store archive sync can use ``(timestamp, message hash)``.

**Fingerprints** come from a lifting monoid: every key is *lifted* to
``XXH3-128(key)`` and a range's value is ``(count, sum of lifts mod 2**128)``.
Addition is commutative and invertible, so the value of ``[lo, hi)`` is
``prefix(hi) - prefix(lo)``, and :class:`RangeIndex` answers every prefix in
O(log n) from an augmented B+-tree kept up to date on insert and remove. The
fingerprint on the wire is ``XXH3-128(count || sum)`` (16 bytes), so the count
is part of what is compared. Why XXH3-128: it is the fastest xxHash on 64-bit
CPUs (bulk loading hashes every key), its 128-bit output makes an accidental
match of two different ranges a 2**-128 event, and it is stable since xxHash
0.8.0. It is not a cryptographic hash: a peer can craft keys whose sums
collide, which only hides that peer's own data from the sync (every entry is
still validated); use a cryptographic lift if peers must not be able to do that.

**Ranges are circular.** ``[lo, hi)`` with ``lo < hi`` is the usual interval;
``lo >= hi`` wraps past the largest key, so ``[x, x)`` is the whole set. A
*round* is a list of :data:`RangeMessage` ending in :class:`Terminal`. Range
messages carry only their upper bound: a range starts where the previous one
ended, at a :class:`LowerBound`, or, for the first range of a round without
one, at the round's last upper bound. Ranges a round does not mention are
reconciled already (there is no need to send :class:`Done`).

Answering a range (:meth:`Reconciler.receive_round`):

* :class:`Fingerprint` equal to ours: nothing to do. Different: if we hold
  ``threshold`` keys or fewer there, we send them all (:class:`Payload`,
  ``can_respond``); if none, :class:`EmptyPayload`; otherwise we split it into
  ``branching`` parts of equal key count and answer each with a fingerprint,
  or its keys if they are few.
* :class:`Payload` list (the peer's complete keys of the range): both
  differences are now known here. With ``can_respond`` we answer with the
  symmetric difference (``can_respond`` off), so the peer learns it too: a key
  it sent back is one we lack, any other one we have and it lacks.
* :class:`EmptyPayload`: the peer has nothing there; we send our keys.
* With ``group_prefix`` and ``send_lacking`` off, the last two answers leave out
  our keys of groups the peer was just shown to hold nothing of (:class:`Reconciler`).
* :class:`EmptySet` opens a session from an empty set: we send all our keys, or a
  bare Terminal (``keys_for_empty_set`` off, see :class:`Reconciler`: the peer
  learns nothing from a list of keys it will receive anyway).

A round *needs an answer* when it has a fingerprint, an empty payload or a
payload with ``can_respond``. Whoever receives a round that needs none, or
answers with one that needs none, is finished; a finished peer sends nothing
more. Identical sets take one round trip: a fingerprint, then a bare Terminal.
"""

from __future__ import annotations

from sdk.sync.rbsr import index, messages, monoid, node_store, reconciler
from sdk.sync.rbsr.index import *  # noqa: F403
from sdk.sync.rbsr.messages import *  # noqa: F403
from sdk.sync.rbsr.monoid import *  # noqa: F403
from sdk.sync.rbsr.node_store import *  # noqa: F403
from sdk.sync.rbsr.reconciler import *  # noqa: F403

# Every public name of the package's modules (the typing spec's form of a re-export), as
# sdk.sync.bamboo_p2p does: each module's __all__ is the one list of its public names.
__all__: list[str] = []
__all__ += index.__all__
__all__ += messages.__all__
__all__ += monoid.__all__
__all__ += node_store.__all__
__all__ += reconciler.__all__
