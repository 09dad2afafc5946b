"""The load-balanced cp layout and the per-chunk attention math, in one process (the all-gather
is replaced by the full K/V; tests/dist checks the collective itself)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias
from torch.overrides import TorchFunctionMode

from autoplan.model_spec import PRESETS
from autoplan.runtime.context_parallel import ContextParallel, LoadBalancedLayout
from autoplan.runtime.models.layers import Attention


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_layout_holds_chunks_i_and_2cp_minus_1_minus_i(cp):
    s = 16 * cp
    seq = torch.arange(s)[None, :]  # (b=1, s): a token's value is its position
    shards = [LoadBalancedLayout(cp, r).shard(seq) for r in range(cp)]
    c = s // (2 * cp)
    for r, shard in enumerate(shards):
        layout = LoadBalancedLayout(cp, r)
        assert torch.equal(shard[0], layout.positions(shard.shape[1]))
        assert shard[0, 0] == r * c and shard[0, c] == (2 * cp - 1 - r) * c
    gathered = torch.cat(shards, dim=1)  # what an all-gather in rank order returns
    order = LoadBalancedLayout(cp, 0).natural_order(s // cp)
    assert torch.equal(gathered[:, order], seq)


class _NoGather(ContextParallel):
    """One cp rank whose "all-gather" returns the full sequence's K/V, given beforehand."""

    def __init__(self, cp: int, rank: int, k_full, v_full) -> None:
        self.size, self.layout = cp, LoadBalancedLayout(cp, rank)
        self.k_full, self.v_full = k_full, v_full

    def gather_kv(self, k, v):
        return self.k_full, self.v_full


class _SdpaMasks(TorchFunctionMode, list):
    """The attn_mask of every SDPA call made inside it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.append(kwargs.get("attn_mask"))
        return func(*args, **kwargs)


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_computes_its_rows_of_causal_attention(cp):
    """The layer's own core (tiny-llama: 4 query heads over 2 kv heads, repeated inside the core
    after the gather) on each rank's chunks gives that rank's rows of the full causal attention,
    and SDPA is never handed a dense mask: on CUDA the flash kernel takes every call."""
    torch.manual_seed(0)
    spec = PRESETS["tiny-llama"]
    core = Attention(spec).core
    b, s, d = 2, 8 * cp, 8
    q, k, v = torch.randn(b, 4, s, d), torch.randn(b, 2, s, d), torch.randn(b, 2, s, d)
    full = core(q, k, v)

    with _SdpaMasks() as masks:
        for r in range(cp):
            ctx = _NoGather(cp, r, k, v)
            local_q = ctx.layout.shard(q, dim=2)
            got = ctx.attention(local_q, None, None, core)
            torch.testing.assert_close(got, ctx.layout.shard(full, dim=2), rtol=1e-6, atol=1e-6)
    assert len(masks) == 2 * cp
    assert all(m is None or isinstance(m, CausalBias) for m in masks), [type(m) for m in masks]


def test_rope_tables_are_taken_at_global_positions():
    from autoplan.runtime.models.layers import rope_cos_sin

    ctx = _NoGather(2, 1, None, None)
    cos, sin = ctx.rope_cos_sin(16, 8, torch.device("cpu"), 500000.0)
    full_cos, full_sin = rope_cos_sin(32, 8, torch.device("cpu"), 500000.0)
    pos = torch.cat([torch.arange(8, 16), torch.arange(16, 24)])  # chunks 1 and 2 of 4
    assert torch.equal(cos, full_cos[pos]) and torch.equal(sin, full_sin[pos])
