"""Pareto fronts of objective matrices (smaller is better in every column), in numpy.

A skyline peel: the best remaining point by the first objective is always on the front; remove
everything it dominates and repeat. Cost O(n * front size), fine for tens of thousands of rows.
"""

from __future__ import annotations

import numpy as np


def dominates(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a dominates b (broadcast over rows): no worse everywhere and better somewhere."""
    return np.all(a <= b, axis=-1) & np.any(a < b, axis=-1)


def pareto_mask(values: np.ndarray) -> np.ndarray:
    """Boolean mask of the non-dominated rows of `values` (rows x objectives)."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    front = np.zeros(n, dtype=bool)
    alive = np.ones(n, dtype=bool)
    order = np.lexsort(values.T[::-1])  # by first objective, ties by the next ones
    rank_of = np.empty(n, dtype=np.int64)
    rank_of[order] = np.arange(n)
    while alive.any():
        live = np.flatnonzero(alive)
        best = live[np.argmin(rank_of[live])]
        front[best] = True
        alive[best] = False
        alive[live] &= ~dominates(values[best], values[live])
    return front
