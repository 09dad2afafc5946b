"""QK-norm (model.qk_norm, Qwen3) and the norms' epsilon (model.norm_eps) as the runtime builds
them: per-head RMSNorms of q and k over head_dim before RoPE (checked against HF Qwen3Attention's
order, with two planted bugs that must fail the check), the cost model's parameter count, the
checkpoint shapes that name them, a resume across either field refused."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autoplan.cost import params
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Plan
from autoplan.runtime.checkpoint_compat import check_resumable, expected_shapes, model_changes
from autoplan.runtime.models.init import full_init_value
from autoplan.runtime.models.layers import Attention, apply_rope, make_norm, rope_cos_sin
from autoplan.runtime.models.transformer import build_meta_model
from tests.unit.fake_checkpoint import saved_as

LLAMA = PRESETS["tiny-llama"]  # 4 layers, h 64, 4 heads of 16, 2 kv heads, rope
QWEN3 = LLAMA.replace(name="tiny-qwen3", qk_norm=True, norm_eps=1e-6)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps) * weight over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _reference(attn: Attention, x: torch.Tensor, bug: str | None = None) -> torch.Tensor:
    """HF Qwen3Attention.forward: q_norm(q_proj(x).view(b, s, heads, hd)), the same for k,
    then RoPE, causal attention (kv heads repeated), o_proj. `bug`: "after_rope" normalises the
    rotated q and k, "whole_width" normalises each token's whole q and k (OLMo 2's layout)."""
    b, s, _ = x.shape
    hd, eps = attn.head_dim, QWEN3.norm_eps
    q, k = x @ attn.wq.weight.T, x @ attn.wk.weight.T
    v = (x @ attn.wv.weight.T).view(b, s, -1, hd)
    wq, wk = attn.q_norm.weight, attn.k_norm.weight
    if bug == "whole_width":
        q = _rms(q, wq.repeat(q.shape[-1] // hd), eps).view(b, s, -1, hd)
        k = _rms(k, wk.repeat(k.shape[-1] // hd), eps).view(b, s, -1, hd)
    else:
        q, k = q.view(b, s, -1, hd), k.view(b, s, -1, hd)
    if bug is None:
        q, k = _rms(q, wq, eps), _rms(k, wk, eps)
    cos, sin = rope_cos_sin(s, hd, x.device, QWEN3.rope_theta)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if bug == "after_rope":
        q, k = _rms(q, wq, eps), _rms(k, wk, eps)
    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k.repeat_interleave(rep, 2),
                                            v.repeat_interleave(rep, 2)))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, -1) @ attn.wo.weight.T


def test_q_and_k_are_normalised_per_head_before_rope() -> None:
    torch.manual_seed(0)
    attn = Attention(QWEN3)
    with torch.no_grad():  # weights that make the norms and their place matter
        for name, p in attn.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name
                    else 0.5 * torch.randn_like(p))
    x = torch.randn(2, 12, QWEN3.hidden_size)
    got = attn(x)
    torch.testing.assert_close(got, _reference(attn, x), rtol=1e-5, atol=1e-5)
    for bug in ("after_rope", "whole_width"):  # the same check fails on each planted bug
        assert (got - _reference(attn, x, bug)).abs().max() > 1e-3, bug


def test_the_norms_are_head_dim_wide_at_the_models_epsilon() -> None:
    attn = Attention(QWEN3)
    assert tuple(attn.q_norm.weight.shape) == tuple(attn.k_norm.weight.shape) == (16,)
    assert attn.q_norm.eps == attn.k_norm.eps == 1e-6
    assert make_norm(QWEN3).eps == 1e-6 and make_norm(LLAMA).eps == 1e-5
    assert not hasattr(Attention(LLAMA), "q_norm")


@pytest.mark.parametrize("tp", [1, 2])
def test_the_runtime_model_has_the_cost_models_parameters(tp) -> None:
    """Whole model (vocabulary padded for tp): total_params plus the padding rows, 2 x head_dim
    more per block than without QK-norm."""
    model = build_meta_model(QWEN3, tp=tp)
    count = sum(p.numel() for p in model.parameters())
    padding = 2 * (int(params.padded_vocab(QWEN3, tp)) - QWEN3.vocab_size) * QWEN3.hidden_size
    assert count == params.total_params(QWEN3) + padding
    assert count - sum(p.numel() for p in build_meta_model(LLAMA, tp=tp).parameters()) == \
        QWEN3.num_layers * 2 * 16
    tensors = sum(1 for n, _ in model.named_parameters() if n.startswith("layers.0."))
    assert tensors == params.tensors_per_layer(QWEN3) == params.tensors_per_layer(LLAMA) + 2


def test_the_qwen3_presets_normalise_q_and_k_at_their_epsilon() -> None:
    """Qwen3-30B-A3B and -235B-A22B (config.json: rms_norm_eps 1e-06, Qwen3MoeAttention's
    q_norm and k_norm): 48 and 94 layers of two 128-wide norms more than before."""
    for name, layers in (("qwen3-30b-a3b", 48), ("qwen3-235b-a22b", 94)):
        spec = PRESETS[name]
        assert (spec.qk_norm, spec.norm_eps) == (True, 1e-6)
        without = params.total_params(spec.replace(qk_norm=False))
        assert params.total_params(spec) - without == layers * 2 * 128
    assert math.isclose(params.total_params(PRESETS["qwen3-30b-a3b"]) / 1e9, 30.53, abs_tol=0.01)


def test_checkpoint_shapes_name_the_norms_and_they_start_at_one() -> None:
    shapes = expected_shapes(QWEN3, 2)
    assert shapes["layers.3.attention.q_norm.weight"] == (16,)
    assert shapes["layers.3.attention.k_norm.weight"] == (16,)
    assert "layers.3.attention.q_norm.weight" not in expected_shapes(LLAMA, 2)
    assert full_init_value("layers.0.attention.k_norm.weight", (16,), 4, 0).eq(1.0).all()


def test_a_checkpoint_saved_without_qk_norm_does_not_resume_with_it(tmp_path) -> None:
    """model_changes names the field (a checkpoint saved before it has no qk_norm in meta.json
    and reads as false); the shapes say which tensors are missing."""
    found = saved_as(LLAMA, tmp_path)
    assert "qk_norm" not in found.meta["model"] and "norm_eps" not in found.meta["model"]
    assert model_changes(found.meta, LLAMA) == []
    assert model_changes(found.meta, QWEN3) == ["model.norm_eps 1e-05 -> 1e-06",
                                                "model.qk_norm False -> True"]
    plan = Plan(model=QWEN3, cluster=ClusterRef("cpu-gloo", 1), batch=Batch(1, 1))
    with pytest.raises(ConfigError) as err:
        check_resumable(found, plan, QWEN3)
    assert "model.qk_norm False -> True" in str(err.value)
    assert "layers.0.attention.k_norm.weight is missing from the checkpoint" in str(err.value)


def test_a_checkpoint_saved_at_another_epsilon_does_not_resume(tmp_path) -> None:
    """Same tensors, another model: the norms would train at another epsilon than saved."""
    found = saved_as(LLAMA, tmp_path)
    other = LLAMA.replace(norm_eps=1e-6)
    plan = Plan(model=other, cluster=ClusterRef("cpu-gloo", 1), batch=Batch(1, 1))
    with pytest.raises(ConfigError, match=r"model.norm_eps 1e-05 -> 1e-06"):
        check_resumable(found, plan, other)
