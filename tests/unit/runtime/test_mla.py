"""Multi-head latent attention in the runtime (models/mla.py): its output against a hand-written
reference of DeepSeek-V2 §2.1's equations (a check that catches RoPE on the wrong part), its
fused SDPA kernel and its parameters against the cost model's (its tensor-parallel shards:
tests/dist/test_mla_parity.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoplan.cost import params
from autoplan.model_spec import DEFAULT_ROPE_THETA, PRESETS
from autoplan.moe_spec import MLASpec

torch = pytest.importorskip("torch")

from autoplan.runtime.models.mla import MultiHeadLatentAttention  # noqa: E402

TINY = PRESETS["tiny-mla"]
SPECS = {
    "tiny-mla": TINY,
    "no-q-latent": TINY.replace(mla=dataclasses.replace(TINY.mla, q_lora_rank=None)),
    "v-wider": TINY.replace(mla=MLASpec(32, 8, 16, 32, q_lora_rank=32)),  # d_v 32 > d_qk 24
}


LATENT_NORM_EPS = TINY.norm_eps
"""The latent norms' epsilon: the model's norm_eps, every SPECS entry's (test_mla_latent_norms_
take_the_models_epsilon holds the module to it)."""


def _rms(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LATENT_NORM_EPS) * weight


def _rotate(t, positions, theta=DEFAULT_ROPE_THETA):
    """RoPE as complex multiplication of consecutive pairs (DeepSeek-V3's reference inference
    code, apply_rotary_emb): t (b, s, heads, d_R)."""
    d = t.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64),
                    torch.outer(positions.double(), freqs))
    tc = torch.view_as_complex(t.double().reshape(*t.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(tc * z[None, :, None, :]).flatten(-2)


def reference(mla: MLASpec, w: dict, x, rope_on: str = "rope"):
    """DeepSeek-V2 eqs. 9-19 in float64, one head at a time. `rope_on="nope"` is a planted bug:
    the rotation applied to the first d_R columns of the no-position parts instead."""
    x = x.double()
    w = {k: v.double() for k, v in w.items()}
    b, s, _ = x.shape
    dh, dr, dv, dc = (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim,
                      mla.kv_lora_rank)
    heads = w["wo.weight"].shape[1] // dv
    if mla.q_lora_rank is None:
        q = x @ w["wq.weight"].T
    else:
        q = _rms(x @ w["wq_a.weight"].T, w["q_norm.weight"]) @ w["wq_b.weight"].T
    q = q.view(b, s, heads, dh + dr)
    latent = x @ w["wkv_a.weight"].T
    c, k_r = latent[..., :dc], latent[..., dc:]
    kv = (_rms(c, w["kv_norm.weight"]) @ w["wkv_b.weight"].T).view(b, s, heads, dh + dv)
    pos = torch.arange(s)
    q_c, q_r, k_c, v = q[..., :dh], q[..., dh:], kv[..., :dh], kv[..., dh:]
    k_r = k_r[:, :, None, :]
    if rope_on == "rope":
        q_r, k_r = _rotate(q_r, pos), _rotate(k_r, pos)
    else:
        q_c = torch.cat([_rotate(q_c[..., :dr], pos), q_c[..., dr:]], -1)
        k_c = torch.cat([_rotate(k_c[..., :dr], pos), k_c[..., dr:]], -1)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    outs = []
    for i in range(heads):
        qi = torch.cat([q_c[:, :, i], q_r[:, :, i]], -1)  # (b, s, dh + dr)
        ki = torch.cat([k_c[:, :, i], k_r[:, :, 0]], -1)  # the rotary key shared by heads
        scores = qi @ ki.transpose(1, 2) / math.sqrt(dh + dr)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        outs.append(probs @ v[:, :, i])
    return torch.cat(outs, -1) @ w["wo.weight"].T


def _module(spec, eager: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    attn = MultiHeadLatentAttention(spec)
    with torch.no_grad():  # weights large enough that attention is sharp, so RoPE matters
        for name, p in attn.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name
                    else 0.4 * torch.randn_like(p))
    attn.eager = eager
    return attn


def _rel(a, b) -> float:
    return float((a.detach().double() - b.detach()).norm() / b.detach().norm())


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("name", list(SPECS))
def test_mla_is_the_papers_attention(name, eager):
    spec = SPECS[name]
    attn = _module(spec, eager)
    x = torch.randn(2, 16, spec.hidden_size)
    w = {k: v.detach() for k, v in attn.state_dict().items()}
    got = attn(x)
    assert got.shape == x.shape
    assert _rel(got, reference(spec.mla, w, x)) < 1e-5
    # the same check fails on the planted bug: RoPE on the no-position part
    assert _rel(got, reference(spec.mla, w, x, rope_on="nope")) > 1e-2


def test_gradients_match_the_reference():
    spec = SPECS["tiny-mla"]
    attn = _module(spec)
    x = torch.randn(2, 16, spec.hidden_size)
    attn(x).pow(2).sum().backward()
    leaves = {k: v.detach().clone().double().requires_grad_() for k, v in
              attn.state_dict().items()}
    reference(spec.mla, leaves, x).pow(2).sum().backward()
    for name, p in attn.named_parameters():
        assert _rel(p.grad, leaves[name].grad) < 1e-4, name


def test_sdpa_runs_the_fused_cpu_kernel():
    """d_v 16 < d_qk 24: v is padded, so torch's CPU flash kernel runs, not the math fallback
    that keeps the s x s probabilities."""
    from torch.profiler import profile

    attn = _module(TINY)
    x = torch.randn(1, 16, TINY.hidden_size)
    with profile() as prof:
        attn(x).sum().backward()
    ops = {e.name for e in prof.events()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


@pytest.mark.parametrize("name", ["tiny-mla", "deepseek-v3"])
def test_parameters_are_the_cost_models(name):
    spec = PRESETS[name]
    for s in (spec, spec.replace(mla=dataclasses.replace(spec.mla, q_lora_rank=None))):
        with torch.device("meta"):
            attn = MultiHeadLatentAttention(s)
        assert sum(p.numel() for p in attn.parameters()) == params.mla_params(s)


def test_mla_latent_norms_take_the_models_epsilon():
    """DeepSeek-V3 normalises its latents at rms_norm_eps 1e-6 (its config.json; HF's
    q_a_layernorm and kv_a_layernorm): the latent norms take the model's norm_eps, which the
    deepseek-v3 preset sets, not a fixed 1e-5."""
    assert PRESETS["deepseek-v3"].norm_eps == 1e-6
    with torch.device("meta"):
        attn = MultiHeadLatentAttention(TINY.replace(norm_eps=1e-6))
    assert (attn.q_norm.eps, attn.kv_norm.eps) == (1e-6, 1e-6)


@pytest.mark.parametrize("kw", [dict(tp=2, sp=True), dict(cp=2), dict(pp=2, mbs=1),
                                dict(dp=2, zero=3, recompute="selective")])
def test_autoplan_train_accepts_mla_plans(kw):
    """No runtime rule refuses a model.mla plan any more (the runtime-mla rule is gone)."""
    from autoplan.plan_rules import runtime_limits
    from autoplan.runtime.validation import check_plan
    from tests.dist.parity import make_plan

    plan = make_plan("tiny-mla", **kw)
    assert runtime_limits(plan, TINY) == []
    check_plan(plan, TINY, plan.world_size)
