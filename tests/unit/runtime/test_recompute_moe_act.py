"""Recompute by module in a MoE block: moe_act (Megatron-Core's output-discarding checkpoint of
the routed experts' activation) frees exactly the bytes the cost model says, and no module set
changes a gradient (bitwise, fp32, one process)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from autoplan.cost import activations, moe
from autoplan.model_spec import MlpKind, load_model
from autoplan.plan import RecomputeModule
from autoplan.plan_table import modules_mask
from autoplan.profiler.activations import saved_bytes
from autoplan.runtime import module_recompute
from autoplan.runtime.models.moe import MoE
from autoplan.runtime.models.transformer import Block
from autoplan.runtime.recompute import checkpoint_fn

M = RecomputeModule
TINY = load_model("tiny-moe")
B = 2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _spec(mlp: MlpKind):
    """tiny-moe with every block a MoE block (so the cost model's mean block is one)."""
    return TINY.replace(mlp=mlp, moe=dataclasses.replace(TINY.moe, first_dense_layers=0))


def _block(spec, modules: tuple[RecomputeModule, ...], dtype: torch.dtype) -> Block:
    gen = torch.Generator().manual_seed(0)
    block = Block(spec, index=0)
    assert isinstance(block.feed_forward, MoE)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    block = block.to(dtype)
    if modules:
        module_recompute.apply_modules(block, frozenset(modules), checkpoint_fn)
    return block


class _FreshInput(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        return self.inner(x0 * 1.0)


def _kept(spec, modules, precision: str) -> int:
    x = torch.randn(B, spec.seq_len, spec.hidden_size, dtype=DTYPES[precision],
                    generator=torch.Generator().manual_seed(1)).requires_grad_()
    return saved_bytes(_FreshInput(_block(spec, modules, DTYPES[precision])), x)


ROWS = SimpleNamespace(b=np.array(float(B)), cp=np.array(1.0), tp=np.array(1.0),
                       etp=np.array(1.0), ep=np.array(1.0))
"""One rank of a plan without any parallelism, as the cost model's row columns."""


def _model_parts(spec) -> dict:
    """The cost model's activation parts of one block for autoplan's runtime (composite
    RMSNorm, eager SwiGLU keeps silu(gate) too: fused_swiglu False), one rank, dropless."""
    parts = activations.activation_elements_per_layer(
        spec, np.array(B), np.array(1), np.array(False), np.array(1), eager_attention=False,
        fused_norm=False, fused_swiglu=False)
    return moe.routed_activation_parts(spec, ROWS, parts)


def _predicted_drop(spec, modules, precision: str) -> float:
    """The cost model's bytes freed per block for autoplan's runtime."""
    parts = _model_parts(spec)
    none = activations.activation_bytes_per_layer(parts, np.array(0), precision)
    kept = activations.activation_bytes_per_layer(parts, np.array(1), precision,
                                                  modules=np.array(modules_mask(modules)))
    return float(none - kept)


@pytest.mark.parametrize("mlp", [MlpKind.SWIGLU, MlpKind.GELU], ids=["swiglu", "gelu"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_moe_act_frees_the_cost_models_bytes(mlp, precision) -> None:
    """Every token's k expert copies drop their activation output (and eager SwiGLU's
    silu(gate)): T*k*f_e elements per tensor. Measured and predicted agree to the byte, and the
    drop is at least one such tensor, so a kept or an extra tensor cannot pass."""
    spec = _spec(mlp)
    measured = _kept(spec, (), precision) - _kept(spec, (M.MOE_ACT,), precision)
    predicted = _predicted_drop(spec, (M.MOE_ACT,), precision)
    one = B * spec.seq_len * spec.moe.experts_per_token * spec.moe.expert_ffn_hidden_size \
        * DTYPES[precision].itemsize
    assert measured == predicted
    assert measured == (2 if mlp is MlpKind.SWIGLU else 1) * one


def test_layernorm_in_a_moe_block_keeps_the_routed_copies() -> None:
    """layernorm frees the norms' outputs but not the dispatch's copies of them: the measured
    drop matches the cost model, which leaves gemm_in_routed kept."""
    spec = _spec(MlpKind.SWIGLU)
    for modules in ((M.LAYERNORM,), (M.LAYERNORM, M.MOE_ACT)):
        measured = _kept(spec, (), "fp32") - _kept(spec, modules, "fp32")
        predicted = _predicted_drop(spec, modules, "fp32")
        stats = 2 * B * spec.seq_len * 4  # two RMSNorms' fp32 rstd, which activations.py leaves out
        assert abs(measured - predicted) <= stats, (modules, measured, predicted)


def _grads(spec, modules) -> list[torch.Tensor]:
    block = _block(spec, modules, torch.float32)
    x = torch.randn(B, spec.seq_len, spec.hidden_size,
                    generator=torch.Generator().manual_seed(2)).requires_grad_()
    block(x).square().mean().backward()
    return [x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("modules", [(M.MOE_ACT,), (M.LAYERNORM, M.MOE_ACT), tuple(M)],
                         ids=["moe_act", "layernorm+moe_act", "all"])
def test_moe_block_gradients_bitwise_equal(modules) -> None:
    spec = _spec(MlpKind.SWIGLU)
    ref, got = _grads(spec, ()), _grads(spec, modules)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


def test_planted_bug_act_input_for_its_output_is_caught(monkeypatch) -> None:
    """A hook that hands fc2 the activation's first input (fc1's gate output) instead of
    re-running the activation leaves the forward unchanged but fc2's weight gradient wrong."""
    def wrong_unpack(packed):
        if isinstance(packed, tuple):
            note, size, stride, offset = packed
            return note.args[0].as_strided(size, stride, offset)
        return packed

    spec = _spec(MlpKind.SWIGLU)
    ref = _grads(spec, ())
    monkeypatch.setattr(module_recompute._DiscardOutputs, "unpack", staticmethod(wrong_unpack))
    got = _grads(spec, (M.MOE_ACT,))
    assert not all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
