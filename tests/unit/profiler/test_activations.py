"""Bytes a runtime block keeps for backward, per recompute policy, against cost/activations.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from autoplan.cost import activations, memory
from autoplan.model_spec import PRESETS, NormKind, PositionKind
from autoplan.plan import Attention, RecomputePolicy
from autoplan.profiler.activations import (
    backward_peak_bytes,
    block_with_policy,
    measure_block,
    saved_bytes,
)
from autoplan.runtime.models.layers import set_attention

CPU = torch.device("cpu")
GPT = PRESETS["tiny"]                                    # LayerNorm, GELU, learned positions
LLAMA_MHA = PRESETS["tiny-llama"].replace(num_kv_heads=4)  # RMSNorm, SwiGLU, RoPE; no GQA
LLAMA_QK_NORM = PRESETS["tiny-llama"].replace(qk_norm=True)  # Qwen3's per-head q/k norms
B = 2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def test_views_of_one_storage_count_once() -> None:
    class TwoViews(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = x * 2.0                                  # one new storage of x's size
            return a[:, :4].sin() + a[:, 4:].sin()       # sin saves two views of it

    x = torch.randn(3, 8, requires_grad=True)
    assert saved_bytes(TwoViews(), x) == x.numel() * 4


@pytest.mark.parametrize("spec", [GPT, PRESETS["tiny-llama"]], ids=["gpt", "llama-gqa"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_full_recompute_keeps_exactly_the_block_input(spec, tp, precision) -> None:
    kept, input_bytes = measure_block(spec, B, spec.seq_len, tp, RecomputePolicy.FULL, CPU,
                                      DTYPES[precision])
    assert kept == input_bytes == B * spec.seq_len * spec.hidden_size * (
        4 if precision == "fp32" else 2)


@pytest.mark.parametrize("spec", [GPT, PRESETS["tiny-llama"]], ids=["gpt", "llama-gqa"])
def test_selective_keeps_less_than_none_and_more_than_full(spec) -> None:
    kept = {p: measure_block(spec, B, spec.seq_len, 1, p, CPU, torch.float32)[0]
            for p in RecomputePolicy}
    assert kept[RecomputePolicy.FULL] < kept[RecomputePolicy.SELECTIVE] < kept[
        RecomputePolicy.NONE]


def _unmodelled_bytes(spec, tp: int, precision: str) -> float:
    """What activations.py leaves out or rounds, each bounded from above:
    - per-row statistics of the two norms (LayerNorm mean and rstd, RMSNorm rstd), <= 4 bytes,
      and of the QK-norms (one rstd per head of q and k);
    - RoPE's cos and sin tables, (s, head_dim/2) fp32 each;
    - the flash row statistics (logsumexp, fp32: 4asb/t) that an fp32 run counts twice."""
    s = spec.seq_len
    stats = 2 * (2 if spec.norm is NormKind.LAYERNORM else 1) * B * s * 4
    if spec.qk_norm:
        stats += (spec.num_heads + spec.kv_heads) // tp * B * s * 4
    rope = 2 * s * spec.head_dim // 2 * 4 if spec.position is PositionKind.ROPE else 0
    lse = 4 * spec.num_heads // tp * s * B if precision == "fp32" else 0
    return float(stats + rope + lse)


@pytest.mark.parametrize("spec", [GPT, LLAMA_MHA, PRESETS["tiny-llama"], LLAMA_QK_NORM],
                         ids=["gpt", "llama-mha", "llama-gqa", "llama-qk-norm"])
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_none_policy_matches_the_activation_formula(spec, tp, precision) -> None:
    kept, _ = measure_block(spec, B, spec.seq_len, tp, RecomputePolicy.NONE, CPU,
                            DTYPES[precision])
    # autoplan's runtime on CPU (runtime traits autoplan-cpu): composite RMSNorm, eager SwiGLU
    parts = activations.activation_elements_per_layer(spec, np.array(B), np.array(tp),
                                                      np.array(False), np.array(1),
                                                      eager_attention=False,  # SDPA is fused
                                                      fused_norm=False, fused_swiglu=False,
                                                      kv_repeated=True)  # repeat_interleave
    formula = float(activations.activation_bytes_per_layer(parts, np.array(0), precision))
    slack = _unmodelled_bytes(spec, tp, precision)
    one_tensor = B * spec.seq_len * spec.hidden_size * DTYPES[precision].itemsize
    assert slack < one_tensor  # a missing or extra (b, s, h) activation cannot hide in it
    assert abs(kept - formula) <= slack


@pytest.mark.parametrize("spec", [GPT, PRESETS["tiny-llama"], LLAMA_QK_NORM],
                         ids=["gpt", "llama-gqa", "llama-qk-norm"])
@pytest.mark.parametrize("attention", [Attention.FLASH, Attention.EAGER])
@pytest.mark.parametrize("policy", [RecomputePolicy.NONE, RecomputePolicy.FULL])
def test_backward_peak_is_the_kept_blocks_plus_the_wavefront(spec, attention, policy) -> None:
    """Three blocks, forward then backward: the most bytes alive in backward are what the
    forward left (3 x kept), what the recomputed block re-makes (a_none - kept) and the
    gradients in flight, memory.backward_wavefront_bytes (what it leaves out: the recomputed
    causal mask, RoPE's and the norms' small temporaries, under 12% of it here). The former
    rule, a whole block of activations in flight, is 1.4-3.3x these."""
    spec = spec.replace(seq_len=4 * spec.seq_len)  # the s^2 and f-wide tensors dominate
    dtype = torch.float32  # bf16 on a CPU: see memory.backward_wavefront_bytes

    def block(p: RecomputePolicy) -> nn.Module:
        b = block_with_policy(spec, 1, p, CPU, dtype)
        set_attention(b, attention)
        return b

    x = torch.randn(B, spec.seq_len, spec.hidden_size, dtype=dtype, requires_grad=True)
    kept, a_none = saved_bytes(block(policy), x), saved_bytes(block(RecomputePolicy.NONE), x)
    after_forward, peak = backward_peak_bytes(nn.Sequential(*(block(policy) for _ in range(3))),
                                              x)
    measured = peak - after_forward - (a_none - kept)
    parts = activations.activation_elements_per_layer(
        spec, np.array(B), np.array(1), np.array(False), np.array(1),
        eager_attention=attention is Attention.EAGER, fused_norm=False, fused_swiglu=False,
        kv_repeated=True)
    wavefront = float(memory.backward_wavefront_bytes(parts, attention is Attention.EAGER,
                                                      "fp32"))
    assert abs(measured - wavefront) <= 0.12 * wavefront
