"""Rateless Invertible Bloom Lookup Tables (Yang et al., "Practical Rateless Set
Reconciliation", SIGCOMM 2024): find the symmetric difference of two sets of
fixed-size items with about 1.35 coded symbols per differing item.

Theory of operation
-------------------
Both peers hold sets of *source symbols* (items): byte strings of one fixed
size. A *coded symbol* is the triple (sum, checksum, count): the XOR of the
items mapped to it, the XOR of their 64-bit checksums, and how many there are.
Every set defines an infinite sequence of coded symbols; item ``x`` is mapped
to coded symbol ``i`` with probability ``1 / (1 + i/2)`` (paper §4.1), by a
pseudo-random index sequence seeded with the item's checksum, so both sides
agree on the mapping without talking.

The :class:`Encoder` produces the sequence on demand, one symbol or a batch at
a time. The :class:`Decoder` holds the other set, subtracts its own items from
each received coded symbol, and *peels*: a coded symbol with count ±1 whose
checksum matches the checksum of its sum holds exactly one item, present only
at the encoder (+1) or only at the decoder (-1); that item is removed from
every coded symbol it maps to, which may make others pure (paper §4.2).
Decoding is done when every received coded symbol is empty.

Peers must agree on the index mapping bit for bit. It is the one of the
paper's Go reference (``github.com/yangl1996/riblt``, ``mapping.go``
``nextIndex``): multiply the 64-bit state by ``0xda942042e4dd58b5``, then step
``ceil((i + 1.5) * (2**32 / sqrt(r + 1) - 1))``; the Rust crate and its npm
port (``@peerbit/riblt``, ``src/encoding.rs`` ``RandomMapping::next_index``)
and Beelay (``src/riblt.rs``) use the same. The decoder keeps the Go
reference's "dirty" list and re-checks purity when it gets to a symbol
(``decoder.go`` ``TryDecode``), where the Rust port peels whatever had count
±1 when it was queued.

Bounds: a corrupt or adversarial stream can send symbols that never peel. The
decoder refuses to hold more than ``max_symbols`` coded symbols or to recover
more than ``max_difference`` items, raising :class:`DecodeLimitExceeded`; the
work per received symbol is bounded by the items and peeled items mapped to
it, so decoding never hangs and memory never grows past those limits.

The checksum function is a parameter (:class:`SymbolFormat`), e.g. :func:`siphash`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sdk.sync.errors import LimitExceeded, LocalProtocolError, SyncError

MASK64 = (1 << 64) - 1
#: The multiplier of the index mapping's 64-bit PRNG (Go reference ``mapping.go``).
MAPPING_MULTIPLIER = 0xDA942042E4DD58B5


class RibltError(SyncError):
    """Base of every error this module raises (a branch of :mod:`sdk.sync.errors`)."""


class DecodeLimitExceeded(RibltError, LimitExceeded):
    """The stream did not decode within the configured bounds (corrupt, adversarial,
    or a difference larger than the caller allowed); fall back or give up."""


class SymbolSizeError(RibltError, LocalProtocolError):
    """An item or coded symbol does not have the format's symbol size."""


def siphash(key: bytes, data: bytes, c_rounds: int = 2, d_rounds: int = 4) -> int:
    """SipHash-c-d of ``data`` under the 16-byte ``key`` (Aumasson and Bernstein, 2012).

    SipHash-2-4 is the paper's default and the npm port's; SipHash-1-3 is what Rust's
    ``DefaultHasher`` (and so Beelay's symbol checksum) and CPython's ``hash``
    compute. The SipRound is written out inline: this runs once per item.
    """
    if len(key) != 16:
        raise ValueError("a SipHash key is 16 bytes")
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    length = len(data)
    tail = length & 7
    blocks = [int.from_bytes(data[i : i + 8], "little") for i in range(0, length - tail, 8)]
    blocks.append(int.from_bytes(data[length - tail :], "little") | ((length & 0xFF) << 56))
    m = MASK64
    # Each block's compression (c rounds), then the finalization (0xFF into v2, d rounds).
    for block, rounds, final in [*((b, c_rounds, 0) for b in blocks), (0, d_rounds, 0xFF)]:
        v3 ^= block
        v2 ^= final
        for _ in range(rounds):
            v0 = (v0 + v1) & m
            v1 = (((v1 << 13) | (v1 >> 51)) & m) ^ v0
            v0 = ((v0 << 32) | (v0 >> 32)) & m
            v2 = (v2 + v3) & m
            v3 = (((v3 << 16) | (v3 >> 48)) & m) ^ v2
            v0 = (v0 + v3) & m
            v3 = (((v3 << 21) | (v3 >> 43)) & m) ^ v0
            v2 = (v2 + v1) & m
            v1 = (((v1 << 17) | (v1 >> 47)) & m) ^ v2
            v2 = ((v2 << 32) | (v2 >> 32)) & m
        v0 ^= block
    return v0 ^ v1 ^ v2 ^ v3


@dataclass(frozen=True, slots=True)
class SymbolFormat:
    """What both peers agree on: the item size in bytes and the item checksum.

    ``checksum`` maps an item to a 64-bit integer; it seeds the item's index
    mapping and tells pure coded symbols apart, so it must not be linear over
    XOR (a plain prefix of a digest would be).
    """

    symbol_size: int
    checksum: Callable[[bytes], int]

    def check(self, item: bytes, what: str = "an item") -> bytes:
        """``item`` as bytes, or :class:`SymbolSizeError` if its size is wrong."""
        if len(item) != self.symbol_size:
            raise SymbolSizeError(f"{what} is {self.symbol_size} bytes, got {len(item)}")
        return bytes(item)


@dataclass(frozen=True, slots=True)
class CodedSymbol:
    """One coded symbol: XOR ``sum`` of items, XOR ``checksum`` of theirs, ``count``."""

    sum: bytes
    checksum: int
    count: int

    @property
    def is_empty(self) -> bool:
        """True when nothing is mapped here (or everything cancelled out)."""
        return self.count == 0 and self.checksum == 0 and not any(self.sum)


def next_index(state: int, last: int) -> tuple[int, int]:
    """One step of an item's index mapping (see the module docstring): ``(new PRNG state,
    next coded index)``, in IEEE double arithmetic exactly as the references compute it."""
    r = (state * MAPPING_MULTIPLIER) & MASK64
    step = math.ceil((float(last) + 1.5) * (4294967296.0 / math.sqrt(float(r) + 1.0) - 1.0))
    # Rust's float-to-u64 cast saturates; the sum wraps (wrapping_add).
    return r, (last + min(step, MASK64)) & MASK64


class _CodingWindow:
    """Items and where each maps next: a heap ordered by the next coded index."""

    __slots__ = ("checksums", "heap", "lasts", "next_idx", "seen", "states", "values")

    def __init__(self) -> None:
        self.values: list[int] = []
        self.checksums: list[int] = []
        self.states: list[int] = []
        self.lasts: list[int] = []
        self.heap: list[tuple[int, int]] = []
        self.next_idx = 0
        #: The source items added with :meth:`add_item` (each is added once).
        self.seen: set[bytes] = set()

    def add_item(self, symbol_format: SymbolFormat, item: bytes) -> None:
        """Add a source item (checked, once) at index 0."""
        item = symbol_format.check(item)
        if item not in self.seen:
            self.seen.add(item)
            checksum = symbol_format.checksum(item) & MASK64
            self.add(int.from_bytes(item, "big"), checksum, checksum, 0)

    def add(self, value: int, checksum: int, state: int, last: int) -> None:
        self.values.append(value)
        self.checksums.append(checksum)
        self.states.append(state)
        self.lasts.append(last)
        heapq.heappush(self.heap, (last, len(self.values) - 1))

    def apply_next(self) -> tuple[int, int, int]:
        """XOR of values, of checksums, and the count of items mapped to ``next_idx``."""
        total = check = count = 0
        heap, idx = self.heap, self.next_idx
        while heap and heap[0][0] == idx:
            source = heap[0][1]
            total ^= self.values[source]
            check ^= self.checksums[source]
            count += 1
            self.states[source], last = next_index(self.states[source], self.lasts[source])
            self.lasts[source] = last
            heapq.heapreplace(heap, (last, source))
        self.next_idx = idx + 1
        return total, check, count


class Encoder:
    """Produces a set's coded symbols on demand (paper §4.1).

    Add every item first; the set is frozen once a symbol has been produced.
    """

    def __init__(self, symbol_format: SymbolFormat, items: Iterable[bytes] = ()) -> None:
        self.format = symbol_format
        self._window = _CodingWindow()
        for item in items:
            self.add(item)

    def __len__(self) -> int:
        return len(self._window.values)

    @property
    def produced(self) -> int:
        """How many coded symbols have been produced so far."""
        return self._window.next_idx

    def add(self, item: bytes) -> None:
        """Add one item (a duplicate is ignored: this is a set)."""
        if self._window.next_idx:
            raise RibltError("the set is frozen once coded symbols have been produced")
        self._window.add_item(self.format, item)

    def produce(self) -> CodedSymbol:
        """The next coded symbol of the sequence."""
        total, check, count = self._window.apply_next()
        return CodedSymbol(total.to_bytes(self.format.symbol_size, "big"), check, count)

    def produce_batch(self, n: int) -> list[CodedSymbol]:
        """The next ``n`` coded symbols."""
        return [self.produce() for _ in range(n)]


class Decoder:
    """Recovers the difference between its own set and an encoder's (paper §4.2).

    Add the local items, then feed the encoder's coded symbols in order with
    :meth:`add_symbol` and call :meth:`try_decode` after each batch, until
    :attr:`decoded` (then :attr:`remote` and :attr:`local` hold the difference).
    """

    def __init__(
        self,
        symbol_format: SymbolFormat,
        items: Iterable[bytes] = (),
        *,
        max_symbols: int = 1 << 20,
        max_difference: int = 1 << 19,
    ) -> None:
        if max_symbols < 1 or max_difference < 0:
            raise ValueError("max_symbols must be >= 1 and max_difference >= 0")
        self.format = symbol_format
        self.max_symbols = max_symbols
        self.max_difference = max_difference
        self._window = _CodingWindow()  # this side's items
        self._remote = _CodingWindow()  # peeled: only at the encoder
        self._local = _CodingWindow()  # peeled: only here
        self._sums: list[int] = []
        self._checks: list[int] = []
        self._counts: list[int] = []
        self._dirty: list[int] = []
        self._is_dirty: list[bool] = []
        self._nonzero = 0
        for item in items:
            self.add_item(item)

    def add_item(self, item: bytes) -> None:
        """Add one of this side's items (before any coded symbol arrives)."""
        if self._sums:
            raise RibltError("add local items before the first coded symbol")
        self._window.add_item(self.format, item)

    def add_symbol(self, symbol: CodedSymbol) -> None:
        """Take the encoder's next coded symbol (at most ``max_symbols``, see Bounds in the
        module docstring)."""
        self.format.check(symbol.sum, "a coded symbol's sum")
        if len(self._sums) >= self.max_symbols:
            raise DecodeLimitExceeded(
                f"no decoding after {self.max_symbols} coded symbols (the configured limit)"
            )
        total, check, count = int.from_bytes(symbol.sum, "big"), symbol.checksum, symbol.count
        # Subtract this side's items and those peeled so far (only here: add them back).
        for window, sign in ((self._window, -1), (self._remote, -1), (self._local, 1)):
            s, c, n = window.apply_next()
            total, check, count = total ^ s, check ^ c, count + sign * n
        check &= MASK64
        self._sums.append(total)
        self._checks.append(check)
        self._counts.append(count)
        self._nonzero += bool(total or check or count)
        dirty = -1 <= count <= 1
        self._is_dirty.append(dirty)
        if dirty:
            self._dirty.append(len(self._sums) - 1)

    def add_symbols(self, symbols: Iterable[CodedSymbol]) -> bool:
        """Add a batch of coded symbols, then :meth:`try_decode`; True when decoded."""
        for symbol in symbols:
            self.add_symbol(symbol)
        return self.try_decode()

    def _peel(self, value: int, checksum: int, direction: int) -> tuple[int, int]:
        """Apply a recovered item to every received symbol it maps to; its mapping state."""
        state, last = checksum, 0
        sums, checks, counts, is_dirty = self._sums, self._checks, self._counts, self._is_dirty
        received = len(sums)
        while last < received:
            before = sums[last] or checks[last] or counts[last]
            sums[last] ^= value
            checks[last] ^= checksum
            counts[last] += direction
            after = sums[last] or checks[last] or counts[last]
            self._nonzero += bool(after) - bool(before)
            if not is_dirty[last] and -1 <= counts[last] <= 1:
                self._dirty.append(last)
                is_dirty[last] = True
            state, last = next_index(state, last)
        return state, last

    def try_decode(self) -> bool:
        """Peel every pure coded symbol (recovering at most ``max_difference`` items, see
        Bounds in the module docstring); True when the difference is fully recovered."""
        size = self.format.symbol_size
        checksum_of = self.format.checksum
        dirty = self._dirty
        for index in dirty:  # peeling appends the symbols it may have made pure
            count = self._counts[index]
            if count in (1, -1):
                value, check = self._sums[index], self._checks[index]
                if checksum_of(value.to_bytes(size, "big")) & MASK64 == check:
                    if self.difference_size >= self.max_difference:
                        raise DecodeLimitExceeded(
                            f"the difference exceeds {self.max_difference} items "
                            "(the configured limit)"
                        )
                    # count +1: the item is only at the encoder, so it is removed (-1)
                    # from every symbol; count -1: only here, so it is added back.
                    state, last = self._peel(value, check, -count)
                    window = self._remote if count == 1 else self._local
                    window.add(value, check, state, last)
                    window.next_idx = len(self._sums)
            self._is_dirty[index] = False
        dirty.clear()
        return self.decoded

    @property
    def decoded(self) -> bool:
        """True once at least one symbol arrived and every received symbol is empty."""
        return bool(self._sums) and self._nonzero == 0

    @property
    def symbols_received(self) -> int:
        """How many coded symbols were added."""
        return len(self._sums)

    @property
    def difference_size(self) -> int:
        """How many items have been recovered so far (both directions)."""
        return len(self._remote.values) + len(self._local.values)

    @property
    def remote(self) -> list[bytes]:
        """Items the encoder has and this side lacks (recovered so far)."""
        return [v.to_bytes(self.format.symbol_size, "big") for v in self._remote.values]

    @property
    def local(self) -> list[bytes]:
        """Items this side has and the encoder lacks (recovered so far)."""
        return [v.to_bytes(self.format.symbol_size, "big") for v in self._local.values]


__all__ = [
    "MAPPING_MULTIPLIER",
    "CodedSymbol",
    "DecodeLimitExceeded",
    "Decoder",
    "Encoder",
    "RibltError",
    "SymbolFormat",
    "SymbolSizeError",
    "next_index",
    "siphash",
]
