"""Token dropping in the runtime's MoE block: the capacity mask against a loop written from its
definition, and the block's output against a per-token loop that skips the dropped slots."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autoplan.model_spec import load_model
from autoplan.moe_spec import MoESpec
from autoplan.runtime.models.moe import MoE, capacity_mask, token_index_experts


def _spec(capacity: float | None, experts: int = 8, k: int = 2):
    base = load_model("tiny-moe")
    return base.replace(moe=MoESpec(experts, k, 32, capacity_factor=capacity))


def _mask_by_loop(gates, chosen, seq_len, experts, factor):
    """For each sequence and expert: its slots ordered by gate (descending), then token, then
    slot; the first ceil(s*k*factor/E) are kept."""
    t, k = chosen.shape
    cap = math.ceil(seq_len * k * factor / experts)
    keep = torch.zeros(t, k, dtype=torch.bool)
    for start in range(0, t, seq_len):
        for e in range(experts):
            slots = [(-float(gates[i, j]), i, j) for i in range(start, start + seq_len)
                     for j in range(k) if int(chosen[i, j]) == e]
            for _, i, j in sorted(slots)[:cap]:
                keep[i, j] = True
    return keep


@pytest.mark.parametrize("factor", [0.5, 0.75, 1.0])
def test_capacity_mask_keeps_each_experts_highest_gates_per_sequence(factor):
    gen = torch.Generator().manual_seed(1)
    seq, seqs, experts, k = 64, 2, 8, 2
    chosen = token_index_experts(torch.arange(seq).repeat(seqs), k, experts)
    gates = torch.rand(seq * seqs, k, generator=gen)
    gates[5, 0] = gates[6, 0]  # a tie goes to the earlier token
    got = capacity_mask(gates, chosen, seq, experts, factor)
    assert torch.equal(got, _mask_by_loop(gates, chosen, seq, experts, factor))
    assert not got.all()  # the token-index router is uneven: something is dropped
    per = torch.zeros(seqs, experts, dtype=torch.long)
    for i, j in got.nonzero().tolist():
        per[i // seq, chosen[i, j]] += 1
    assert per.max() <= math.ceil(seq * k * factor / experts)


def _init(module: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def test_dropped_slots_add_nothing_and_kept_ones_keep_their_gate():
    moe = MoE(_spec(1.0)).double()  # float64: the two summation orders agree to ~1e-15
    moe.router_dtype = torch.float64
    _init(moe)
    moe.router_kind = "token-index"
    x = torch.randn(2, 16, moe.router.in_features, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64)
    tokens = x.reshape(-1, x.shape[-1])
    gates, chosen = moe.route(tokens, 16)
    keep = capacity_mask(gates, chosen, 16, moe.num_experts, 1.0)
    assert 0 < int((~keep).sum())
    ex, want = moe.experts, torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):  # y_t = sum over kept slots of gate * expert(x_t)
        for j, e in enumerate(chosen[t].tolist()):
            if keep[t, j]:
                up = F.silu(F.linear(tokens[t], ex.w1.weight[e])) \
                    * F.linear(tokens[t], ex.w3.weight[e])
                want[t] += gates[t, j] * F.linear(up, ex.w2.weight[e])
    got = moe(x).reshape(-1, x.shape[-1])
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    got.sum().backward()
    assert all(p.grad is not None for p in moe.parameters())


def test_a_capacity_no_expert_reaches_is_the_dropless_block():
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(3))
    out = []
    for factor in (None, 4.0):  # capacity 16 * 2 * 4 / 8 = 16 >= a sequence's slots per expert
        moe = MoE(_spec(factor))
        _init(moe)
        out.append(moe(x))
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)


def test_train_accepts_token_dropping_without_context_parallelism():
    import dataclasses

    from autoplan.runtime.validation import check_plan
    from tests.dist.parity import make_plan

    spec = _spec(1.0)
    for kw in ({"dp": 2}, {"dp": 2, "tp": 2, "sp": True}, {"dp": 2, "pp": 2}):
        plan = make_plan(spec, **kw)
        plan = dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, ep=2))
        check_plan(plan, spec, plan.world_size)
