"""A seeded random permutation of ``range(n)`` evaluated row by row, without holding it in memory.

Sharding must give each row a uniformly random place (MOP's convergence relies on shards being
random samples of the data) while reading the source one batch at a time, in any order, from any
number of processes. A Feistel network is a bijection on ``[0, 4**k)``; walking the cycle until
the value falls below ``n`` makes it a bijection on ``[0, n)``. Each row's position is then a pure
function of (seed, n, row number): the same in every process, and O(batch) memory.
"""

from __future__ import annotations

import numpy as np

_ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a strong 64-bit mixing function (wrapping uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _round_keys(seed: int) -> np.ndarray:
    return np.random.SeedSequence([int(seed), 0x5A4D]).generate_state(_ROUNDS, dtype=np.uint64)


def permuted_positions(rows: np.ndarray, n: int, seed: int) -> np.ndarray:
    """The position of each of ``rows`` (values in ``[0, n)``) in a seeded permutation of ``range(n)``."""
    rows = np.asarray(rows, dtype=np.uint64)
    if n <= 1:
        return rows.astype(np.int64)
    half = max(1, (int(n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    keys = _round_keys(seed)

    def encrypt(v: np.ndarray) -> np.ndarray:
        left, right = v >> shift, v & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << shift) | right

    out = encrypt(rows)
    # The domain is at most 4n, so on average fewer than 4 more rounds; each walk stays a bijection.
    pending = np.flatnonzero(out >= np.uint64(n))
    while pending.size:
        out[pending] = encrypt(out[pending])
        pending = pending[out[pending] >= np.uint64(n)]
    return out.astype(np.int64)


def split_of(positions: np.ndarray, total: int, parts: int) -> np.ndarray:
    """Which of ``parts`` near-equal contiguous parts of ``range(total)`` each position falls in.

    The same split as ``numpy.array_split``: the first ``total % parts`` parts hold one row more.
    """
    positions = np.asarray(positions, dtype=np.int64)
    small, extra = divmod(total, parts)
    boundary = extra * (small + 1)
    if small == 0:
        return positions  # fewer rows than parts: one row each, in the first parts
    return np.where(positions < boundary, positions // (small + 1), extra + (positions - boundary) // small)
