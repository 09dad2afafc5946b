"""The MoE block against a per-token loop written from its definition, and its router."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoplan.model_spec import MlpKind, load_model
from autoplan.moe_spec import MoESpec
from autoplan.runtime.models.moe import MoE, token_index_experts, top_k_stable
from autoplan.runtime.models.transformer import Transformer


def _init(module: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def _reference(moe: MoE, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """y_t = sum_j softmax(logits_t[chosen_t])_j * expert_{chosen_tj}(x_t), one token at a time."""
    ex = moe.experts
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = moe.router(x[t])
        gates = torch.softmax(logits[chosen[t]], dim=-1)
        for j, e in enumerate(chosen[t].tolist()):
            up = F.linear(x[t], ex.w1.weight[e])
            if moe.experts.mlp == MlpKind.SWIGLU:
                up = F.silu(up) * F.linear(x[t], ex.w3.weight[e])
            else:
                up = F.gelu(up)
            out[t] += gates[j] * F.linear(up, ex.w2.weight[e])
        if moe.shared is not None:
            out[t] += moe.shared(x[t])
    return out


@pytest.mark.parametrize("mlp,shared", [(MlpKind.SWIGLU, 0), (MlpKind.GELU, 2)])
@pytest.mark.parametrize("router", ["learned", "token-index"])
def test_moe_matches_per_token_loop(mlp, shared, router):
    spec = load_model("tiny-moe").replace(
        mlp=mlp, moe=MoESpec(8, 2, 16, num_shared_experts=shared))
    moe = MoE(spec).double()  # float64: the two summation orders agree to ~1e-15
    moe.router_dtype = torch.float64
    _init(moe)
    moe.router_kind = router
    x = torch.randn(3, 5, spec.hidden_size, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    tokens = x.reshape(-1, spec.hidden_size)
    with torch.no_grad():
        if router == "learned":
            chosen = torch.topk(moe.router(tokens), 2).indices
        else:
            chosen = token_index_experts(torch.arange(15) % 5, 2, 8)
        want = _reference(moe, tokens, chosen).view_as(x)
        got = moe(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gradients_reach_router_and_every_expert_tensor():
    spec = load_model("tiny-moe")
    moe = MoE(spec)
    _init(moe)
    moe(torch.randn(2, 4, spec.hidden_size)).square().sum().backward()
    for name, p in moe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_top_k_ties_go_to_the_lower_expert():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0]])
    assert top_k_stable(logits, 2).tolist() == [[1, 2]]


def test_token_index_router_is_uneven_and_distinct():
    chosen = token_index_experts(torch.arange(64), 2, 8)
    assert (chosen[:, 0] != chosen[:, 1]).all()
    counts = torch.bincount(chosen.flatten(), minlength=8)
    assert counts.sum() == 128 and counts.max() > counts.min()  # not a balanced split


def test_moe_layers_follow_the_spec():
    spec = load_model("tiny-moe")  # first block dense
    model = Transformer(spec)
    kinds = [isinstance(b.feed_forward, MoE) for b in model.layers.values()]
    assert kinds == [spec.moe.is_moe_layer(i) for i in range(spec.num_layers)]
    assert kinds == [False, True, True, True]
