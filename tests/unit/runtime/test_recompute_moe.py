"""A MoE block of autoplan's runtime keeps what the cost model says, to the byte: its eager
router and combine tensors (moe.eager_moe_bytes) beside the dispatched copies and expert MLP
tensors, and recompute.modules moe (the whole MoE layer under a checkpoint, as Megatron-Core's
MoELayer) frees all of them. Gradients stay bitwise equal (fp32, one process)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from autoplan.cost import activations, moe
from autoplan.model_spec import MlpKind
from autoplan.plan import RecomputeModule
from autoplan.plan_table import modules_mask
from tests.unit.runtime.test_recompute_moe_act import (
    DTYPES,
    ROWS,
    B,
    _grads,
    _kept,
    _model_parts,
    _spec,
)

M = RecomputeModule
SHAPES = [(64, 2, 8, 128), (80, 5, 12, 48), (48, 1, 6, 32), (160, 2, 32, 64)]
"""(h, k, E, f_e): hidden sizes, experts per token, experts and expert widths apart."""


def _shaped(mlp: MlpKind, h: int, k: int, e: int, f_e: int):
    spec = _spec(mlp)
    return spec.replace(hidden_size=h, moe=dataclasses.replace(
        spec.moe, experts_per_token=k, num_experts=e, expert_ffn_hidden_size=f_e))


def _predicted(spec, modules, precision: str, recompute: int = 1) -> float:
    """The cost model's bytes per block for autoplan's runtime, its eager MoE bytes included."""
    parts = _model_parts(spec)
    parts["moe_extra"] = moe.eager_moe_bytes(spec, ROWS, precision)
    return float(activations.activation_bytes_per_layer(
        parts, np.array(recompute), precision, modules=np.array(modules_mask(modules))))


def _unmodelled(spec, precision: str) -> int:
    """What activations.py leaves out of every block, as tests/unit/profiler/test_activations.py
    bounds it: the two RMSNorms' fp32 rstd per token, RoPE's cos and sin tables ((s,
    head_dim/2) fp32 each) and, in an fp32 run, the flash logsumexp (fp32 per head and token)."""
    s = spec.seq_len
    lse = 4 * spec.num_heads * s * B if precision == "fp32" else 0
    return 2 * B * s * 4 + 2 * s * spec.head_dim // 2 * 4 + lse


@pytest.mark.parametrize("shape", SHAPES, ids=[f"h{s[0]}-k{s[1]}-E{s[2]}" for s in SHAPES])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_moe_block_keeps_the_cost_models_bytes(shape, precision) -> None:
    """Without recompute the measured bytes exceed the prediction by no more than what
    activations.py leaves out of every block, which is smaller than the k*h tensor of expert
    outputs the combine keeps: leaving out the eager router/combine bytes fails."""
    spec = _shaped(MlpKind.SWIGLU, *shape)
    over = _kept(spec, (), precision) - _predicted(spec, (), precision, recompute=0)
    h, k = spec.hidden_size, spec.moe.experts_per_token
    combine = B * spec.seq_len * k * h * DTYPES[precision].itemsize
    assert 0 <= over <= _unmodelled(spec, precision) < combine


@pytest.mark.parametrize("mlp", [MlpKind.SWIGLU, MlpKind.GELU], ids=["swiglu", "gelu"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_moe_frees_the_cost_models_bytes(mlp, precision) -> None:
    """moe frees exactly the model's MoE-layer bytes; with layernorm the norms' outputs and
    their rstd (which activations.py leaves out) go too."""
    spec = _spec(mlp)
    none = _kept(spec, (), precision)
    drop = none - _kept(spec, (M.MOE,), precision)
    assert drop == _predicted(spec, (), precision, 0) - _predicted(spec, (M.MOE,), precision)
    rstd = 2 * B * spec.seq_len * 4
    with_norms = none - _kept(spec, (M.LAYERNORM, M.MOE), precision)
    assert with_norms == _predicted(spec, (), precision, 0) - _predicted(
        spec, (M.LAYERNORM, M.MOE), precision) + rstd
    # the layer keeps at least its copies and its experts' tensors, so a module that freed
    # only the activation (moe_act) could not pass
    assert drop > 2 * (none - _kept(spec, (M.MOE_ACT,), precision))


@pytest.mark.parametrize("modules", [(M.MOE,), (M.LAYERNORM, M.MOE),
                                     (M.CORE_ATTN, M.LAYERNORM, M.MOE)],
                         ids=["moe", "layernorm+moe", "core_attn+layernorm+moe"])
def test_moe_recompute_gradients_bitwise_equal(modules) -> None:
    spec = _spec(MlpKind.SWIGLU)
    ref, got = _grads(spec, ()), _grads(spec, modules)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
