"""Balanced layer splits: the DP is optimal (against brute force) and shifts blocks away from
the stage that holds a heavy output layer."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.model_spec import load_model
from autoplan.search.partition import (
    balanced_layers,
    layer_graph,
    min_max_partition,
    rank_layers,
    split_columns,
)


def brute(weights: list[float], stages: int) -> float:
    n, best = len(weights), float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=9), st.integers(1, 9))
def test_min_max_partition_is_optimal(weights: list[float], stages: int) -> None:
    if stages > len(weights):
        with pytest.raises(ValueError):
            min_max_partition(np.array(weights), stages)
        return
    sizes = min_max_partition(np.array(weights), stages)
    assert len(sizes) == stages and min(sizes) >= 1 and sum(sizes) == len(weights)
    bounds = np.cumsum((0, *sizes))
    got = max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    assert got == pytest.approx(brute(weights, stages))


def test_layer_graph_is_a_path_from_embedding_to_head() -> None:
    g = layer_graph(load_model("gpt3-1.3b"))
    assert nx.is_directed_acyclic_graph(g)
    order = list(nx.topological_sort(g))
    assert order[0] == "embedding" and order[-1] == "head"
    assert sum(nx.get_node_attributes(g, "blocks").values()) == 24


def test_heavy_head_gets_fewer_blocks() -> None:
    model = load_model("llama-3-8b")  # 128k vocabulary: the head costs about 2.6 blocks
    lps = balanced_layers(model, 4)
    assert sum(lps) == model.num_layers
    assert lps[-1] < model.num_layers // 4
    assert split_columns(model, 4, 1) == (lps[0], max(lps), lps[-1], min(lps))


def test_interleaved_ranks_sum_their_chunks() -> None:
    assert rank_layers((1, 2, 3, 4, 5, 6), 3) == [5, 7, 9]
    assert balanced_layers(load_model("tiny"), 8) is None
