"""The numpy Pareto peel against the O(n^2) definition."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.search.pareto import pareto_mask


def naive(v: np.ndarray) -> np.ndarray:
    n = len(v)
    return np.array([not any(np.all(v[j] <= v[i]) and np.any(v[j] < v[i]) for j in range(n))
                     for i in range(n)], dtype=bool)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_pareto_mask_matches_definition(n: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    v = rng.integers(0, 6, size=(n, k)).astype(float)  # small ints: many ties
    assert np.array_equal(pareto_mask(v), naive(v))
