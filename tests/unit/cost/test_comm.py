"""Communication terms against hand-computed values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoplan.cost import comm
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS


def _flat_profile():
    """h100 links at their datasheet bandwidth (no message-size efficiency curve)."""
    prof = load_profile("h100-sxm-80gb")
    eff = dataclasses.replace(prof.efficiency, intra_node=None, inter_node=None)
    return dataclasses.replace(prof, efficiency=eff)


def test_context_parallel_is_one_kv_all_gather_and_one_reduce_scatter_exposed() -> None:
    """Llama-3-8B (8 kv heads of 128), s = 8192, b = 1, bf16, cp = 4 inside a node: K and V of
    the whole sequence are 2 * 2 B * 8192 * 1024 = 32 MiB; a ring all-gather and a
    reduce-scatter each take 3 latencies + 3/4 of that over the link; nothing hides them."""
    prof, m = _flat_profile(), PRESETS["llama-3-8b"]
    assert (m.kv_heads, m.head_dim, m.seq_len) == (8, 128, 8192)
    kv_all = 2 * 2 * 8192 * 8 * 128
    one = 3 * prof.intra_node.latency_s + 0.75 * kv_all / prof.intra_node.bytes_per_s

    def t(cp, tp=1, core=0.0, **kw):
        return float(comm.context_parallel_time_s(m, np.array(1.0), np.array(float(tp)),
                                                  np.array(float(cp)), 2.0, np.array(core),
                                                  np.array(True), prof, **kw))

    assert t(4) == pytest.approx(2 * one, rel=1e-12)
    assert t(4, core=1.0) == t(4)  # not hidden behind the attention core
    assert t(4, recompute_gathers=1.0) == pytest.approx(3 * one, rel=1e-12)
    assert t(1) == 0.0
    # tp splits the kv heads, so each cp collective carries 1/tp of the bytes
    half = 3 * prof.intra_node.latency_s + 0.75 * kv_all / 2 / prof.intra_node.bytes_per_s
    assert t(4, tp=2) == pytest.approx(2 * half, rel=1e-12)


def test_context_parallel_gathers_kv_heads_not_query_heads() -> None:
    prof = _flat_profile()
    gqa = PRESETS["llama-3-8b"]
    mha = gqa.replace(num_kv_heads=gqa.num_heads)
    args = (np.array(1.0), np.array(1.0), np.array(8.0), 2.0, np.array(0.0), np.array(True),
            prof)
    lat = 2 * 7 * prof.intra_node.latency_s
    ratio = (comm.context_parallel_time_s(mha, *args) - lat) / (
        comm.context_parallel_time_s(gqa, *args) - lat)
    assert float(ratio) == pytest.approx(gqa.num_heads / gqa.kv_heads, rel=1e-9)
