"""The runtime's layers with head_dim set apart from hidden/heads (Qwen3, Gemma) and GeGLU
(Gemma): forward against a hand-written reference, parameter count against the cost model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from autoplan.cost.params import total_params
from autoplan.model_spec import PRESETS, MlpKind
from autoplan.runtime.models.init import materialize_and_init
from autoplan.runtime.models.layers import Attention, FeedForward
from autoplan.runtime.models.transformer import build_meta_model

# a tiny Gemma-2 shape: 4 heads of 24 (q width 96 != hidden 64), 2 KV heads, GeGLU, tied
TINY_GEMMA = PRESETS["tiny-llama"].replace(name="tiny-gemma", head_dim=24, mlp=MlpKind.GEGLU,
                                           tie_embeddings=True)


def _reference_attention(attn: Attention, x: torch.Tensor, heads: int, kv: int, d: int):
    """softmax(q k^T / sqrt(d)) v with a causal mask, heads by hand, no RoPE."""
    b, s, _ = x.shape
    q = (x @ attn.wq.weight.T).view(b, s, heads, d).transpose(1, 2)
    k = (x @ attn.wk.weight.T).view(b, s, kv, d).transpose(1, 2)
    v = (x @ attn.wv.weight.T).view(b, s, kv, d).transpose(1, 2)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(scores, -1) @ v
    return out.transpose(1, 2).reshape(b, s, heads * d) @ attn.wo.weight.T


@pytest.mark.parametrize("eager", [False, True])
def test_attention_with_set_apart_head_dim_matches_the_reference(eager: bool) -> None:
    spec = TINY_GEMMA.replace(position=PRESETS["tiny"].position)  # learned: no RoPE here
    torch.manual_seed(0)
    attn = Attention(spec)
    attn.eager = eager
    assert attn.wq.weight.shape == (96, 64) and attn.wo.weight.shape == (64, 96)
    x = torch.randn(2, 8, 64)
    want = _reference_attention(attn, x, spec.num_heads, spec.kv_heads, 24)
    torch.testing.assert_close(attn(x), want, rtol=1e-5, atol=1e-5)


def test_geglu_is_gelu_gate_times_up() -> None:
    torch.manual_seed(0)
    mlp = FeedForward(TINY_GEMMA)
    x = torch.randn(3, 5, 64)
    want = (F.gelu(x @ mlp.w1.weight.T, approximate="tanh") * (x @ mlp.w3.weight.T)) @ mlp.w2.weight.T
    torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5)
    swiglu = FeedForward(TINY_GEMMA.replace(mlp=MlpKind.SWIGLU))
    swiglu.load_state_dict(mlp.state_dict())
    assert not torch.allclose(swiglu(x), mlp(x))  # the gate's activation is what differs


@pytest.mark.parametrize("spec", [TINY_GEMMA, TINY_GEMMA.replace(tie_embeddings=False,
                                                                  mlp=MlpKind.SWIGLU)])
def test_runtime_model_has_the_parameters_the_cost_model_counts(spec) -> None:
    model = build_meta_model(spec)
    materialize_and_init(model, torch.device("cpu"), spec.num_layers, seed=0,
                         tied=spec.tie_embeddings)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == total_params(spec)
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    assert model(tokens).shape == (2, spec.seq_len, spec.vocab_size)
