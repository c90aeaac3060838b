"""Certificate pools and shortest link paths of Bamboo logs.

Bamboo (README of AljoschaMeyer/bamboo, "Partial Replication and Log
Verification") defines the certificate pool of entry ``x`` as the union of the
shortest link paths from ``x`` to ``w``, from ``w`` to the first entry, and from
``z`` to ``x``, where ``w`` is the largest number of the form (3^k - 1)/2 below
``x`` and ``z`` the smallest such number at or above ``x``. Point-to-point calls
the part at or below ``x`` the *lower* and the part above ``x`` the *upper*
certificate pool.

Paths here are greedy: from the newer entry take the lipmaa link whenever it
does not jump past the target, else the backlink. Lipmaa links never cross
(the graph is anti-monotone), so this is a shortest path; the tests check it
against breadth-first search. The lower pool of ``x`` is then simply the chain
of lipmaa links from ``x`` down to 1, which passes through ``w``.
"""

from __future__ import annotations

from sdk.documents.bamboo import lipmaa


def next_boundary(n: int) -> int:
    """The smallest (3^k - 1)/2 that is at least ``n``."""
    m = 1
    while m < n:
        m = 3 * m + 1
    return m


def shortest_path(newer: int, older: int) -> list[int]:
    """The sequence numbers on the shortest link path from ``newer`` down to ``older``.

    Ascending, both ends included; ``older <= newer``, both >= 1.
    """
    if not 1 <= older <= newer:
        raise ValueError("need 1 <= older <= newer")
    path = [newer]
    current = newer
    while current > older:
        target = lipmaa(current)
        current = target if target >= older else current - 1
        path.append(current)
    path.reverse()
    return path


def lower_pool(n: int) -> list[int]:
    """The lower certificate pool of entry ``n`` without ``n`` itself, ascending
    (``ValueError`` for ``n`` below 1, as :func:`shortest_path`)."""
    return shortest_path(n, 1)[:-1]


def upper_pool(n: int) -> list[int]:
    """The upper certificate pool of entry ``n``: the path from the next boundary down
    to ``n``, without ``n``, ascending (these entries need not exist yet; ``ValueError``
    for ``n`` below 1)."""
    return shortest_path(next_boundary(n), n)[1:]


__all__ = ["lower_pool", "next_boundary", "shortest_path", "upper_pool"]
