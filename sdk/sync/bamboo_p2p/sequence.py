"""The sequence of pieces a request transmits, and cursors into it.

Spec, "The Data Channel": a proposal specifies which data is transmitted, in
order: the metadata of the lower certificate pool entries from the lower
certpool info up to the start, then all data within the range (metadata and
payload of each entry; in a sparse proposal only the entries on the shortest
link path from the end to the start), then the metadata of the upper certificate
pool entries after the end, up to the upper certpool info. One *piece* is one
entry's metadata or one payload; a cursor is the index of the next piece.

A proposal with a starting *offset* begins with the payload of its start entry
(from that byte on) instead of the lower certificate pool and the start's
metadata; a *payload-only* proposal moves the payloads of its range and no
metadata at all (neither pool). Both are this implementation's reading of the
spec's proposal fields (spec lines 58, 60, 181-182; ``docs/bamboo-p2p.md``,
decision 15).

The sequence is fixed by the proposal. An adjustment that lowers the end or the
upper certpool info *truncates* it (pieces of entries above the new limit drop
out; after a lower end the upper pool drops out entirely), so what a peer sent
under the old limits is still a prefix of the same sequence. This is this
implementation's reading where the spec is silent; see ``docs/bamboo-p2p.md``.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from enum import IntEnum

from sdk.sync.bamboo_p2p.certpool import lower_pool, shortest_path, upper_pool
from sdk.sync.bamboo_p2p.messages import Propose

#: Stands for "no end" in piece counts of infinite ranges.
INFINITE = 1 << 80


class PieceKind(IntEnum):
    """What one piece of a request is."""

    METADATA = 0
    PAYLOAD = 1


#: Piece kinds by offset within an entry's two pieces (indexing beats ``PieceKind(n)``).
_KINDS = (PieceKind.METADATA, PieceKind.PAYLOAD)


@dataclass(slots=True)
class _Segment:
    """Positions (sequence numbers) with 1 (metadata) or 2 (and payload) pieces each.

    ``positions`` is an explicit ascending list, or ``None`` for the arithmetic
    run ``first..last`` (``last`` ``None`` for no end).
    """

    per_position: int
    positions: list[int] | None
    first: int = 0
    last: int | None = None
    #: The kind of a one-piece position (metadata of a pool entry, or a lone payload).
    kind: PieceKind = PieceKind.METADATA

    def has_metadata(self) -> bool:
        """Whether the positions of this segment carry their metadata."""
        return self.per_position == 2 or self.kind is PieceKind.METADATA

    def count_upto(self, limit: int | None) -> int:
        """Number of positions <= ``limit`` (all when ``limit`` is None)."""
        if self.positions is not None:
            return len(self.positions) if limit is None else bisect_right(self.positions, limit)
        top = self.last
        if limit is not None:
            top = limit if top is None else min(top, limit)
        if top is None:
            return INFINITE
        return max(0, top - self.first + 1)

    def position(self, index: int) -> int:
        if self.positions is not None:
            return self.positions[index]
        return self.first + index

    def contains(self, seq: int) -> bool:
        if self.positions is not None:
            i = bisect_right(self.positions, seq)
            return i > 0 and self.positions[i - 1] == seq
        return seq >= self.first and (self.last is None or seq <= self.last)


@dataclass(slots=True)
class PieceSequence:
    """The pieces of one request, with the current truncation limit."""

    end: int | None
    upper: int | None
    segments: list[_Segment]
    #: Pieces of each segment, untruncated (segments never change; ``piece`` is hot).
    segment_pieces: list[int]
    #: The piece count as proposed; data beyond it is past the end of the request.
    proposed_count: int
    #: Pieces of entries above this sequence number are not part of the sequence.
    limit: int | None

    @classmethod
    def of(cls, p: Propose) -> PieceSequence:
        """The sequence of a proposal (range already checked; an offset and payload-only
        shape it as the module's docstring says)."""
        start, end, upper = p.start, p.end, p.upper_certpool
        path = shortest_path(end, start) if p.sparse and end is not None else None
        segments: list[_Segment] = []
        if p.payload_only:
            segments.append(_Segment(1, path, start, end, PieceKind.PAYLOAD))
        else:
            if p.lower_certpool is not None:  # exactly when there is no offset
                pool = [n for n in lower_pool(start) if n >= p.lower_certpool]
                segments.append(_Segment(1, pool))
                first = start
            else:
                segments.append(_Segment(1, [start], kind=PieceKind.PAYLOAD))
                first = start + 1
                if path is not None:
                    path = path[1:]
            segments.append(_Segment(2, path, first, end))
            if end is not None and upper is not None:
                segments.append(_Segment(1, [n for n in upper_pool(end) if n <= upper]))
        pieces = [min(s.count_upto(None) * s.per_position, INFINITE) for s in segments]
        return cls(end, upper, segments, pieces, min(sum(pieces), INFINITE), upper)

    def count(self) -> int:
        """Pieces in the (truncated) sequence; :data:`INFINITE` for an open range."""
        total = 0
        for segment in self.segments:
            n = segment.count_upto(self.limit)
            if n >= INFINITE:
                return INFINITE
            total += n * segment.per_position
        return total

    def truncate(self, end: int | None, upper: int | None) -> None:
        """Apply an adjusted end (drops the upper pool) and/or upper certpool info."""
        if end is not None:
            self.end = self.upper = end
            self.limit = end if self.limit is None else min(self.limit, end)
        if upper is not None and (self.upper is None or upper < self.upper):
            self.upper = upper
            self.limit = upper if self.limit is None else min(self.limit, upper)

    def piece(self, index: int) -> tuple[int, PieceKind]:
        """``(sequence number, kind)`` of piece ``index`` (which must exist)."""
        for segment, pieces in zip(self.segments, self.segment_pieces, strict=True):
            if index < pieces:
                if segment.per_position == 1:
                    return segment.position(index), segment.kind
                pos, sub = divmod(index, 2)
                return segment.position(pos), _KINDS[sub]
            index -= pieces
        raise IndexError("piece index past the sequence")

    def has_metadata(self, seq: int) -> bool:
        """Whether the metadata of entry ``seq`` is part of the (proposed) sequence."""
        return any(segment.has_metadata() and segment.contains(seq) for segment in self.segments)

    def metadata_pieces_between(self, first: int, stop: int) -> int:
        """How many of the pieces ``first..stop-1`` are metadata (the rest are payloads)."""
        count = 0
        index = 0
        for segment, pieces in zip(self.segments, self.segment_pieces, strict=True):
            lo, hi = max(first, index), min(stop, index + pieces)
            if lo < hi:
                if segment.per_position == 1:
                    if segment.kind is PieceKind.METADATA:
                        count += hi - lo
                else:
                    # Even offsets within the segment are metadata.
                    a, b = lo - index, hi - index
                    count += (b + 1) // 2 - (a + 1) // 2
            index += pieces
            if index >= stop:
                break
        return count


__all__ = ["INFINITE", "PieceKind", "PieceSequence"]
