"""Module-level recompute and the uniform method: the bytes the runtime keeps against the cost
model's per-module figures, and numerics unchanged (bitwise, fp32, one process)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from autoplan.cost import activations
from autoplan.model_spec import PRESETS, NormKind
from autoplan.plan import RecomputeMethod, RecomputeModule, RecomputePolicy
from autoplan.plan_table import RC_MODULES, modules_mask
from autoplan.profiler.activations import saved_bytes
from autoplan.profiler.layers import build_layer
from autoplan.runtime import module_recompute
from autoplan.runtime.models.transformer import Transformer
from autoplan.runtime.recompute import apply_recompute, checkpoint_fn

CPU = torch.device("cpu")
GPT = PRESETS["tiny"]                                      # LayerNorm, GELU, learned positions
LLAMA_MHA = PRESETS["tiny-llama"].replace(num_kv_heads=4)  # RMSNorm, SwiGLU, RoPE; no GQA
LLAMA_GQA = PRESETS["tiny-llama"]
B = 2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
M = RecomputeModule
MODULE_SETS = [(M.CORE_ATTN,), (M.MLP,), (M.LAYERNORM,), (M.LAYERNORM, M.MLP), tuple(M)]


class _FreshInput(nn.Module):
    """Runs `inner` on a copy of the input made inside the measured forward, so the block input
    is counted exactly when something keeps it (a saved tensor or a checkpoint's input)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        return self.inner(x0 * 1.0)


def _kept(spec, modules: tuple[RecomputeModule, ...], precision: str) -> int:
    torch.manual_seed(0)
    block = build_layer("block", spec, 1, CPU, DTYPES[precision])
    if modules:
        module_recompute.apply_modules(block, frozenset(modules), checkpoint_fn)
    x = torch.randn(B, spec.seq_len, spec.hidden_size, dtype=DTYPES[precision],
                    requires_grad=True)
    return saved_bytes(_FreshInput(block), x)


def _predicted(spec, modules: tuple[RecomputeModule, ...], precision: str) -> float:
    # autoplan's runtime on CPU (traits autoplan-cpu): composite RMSNorm, eager SwiGLU, SDPA
    parts = activations.activation_elements_per_layer(spec, np.array(B), np.array(1),
                                                      np.array(False), np.array(1),
                                                      eager_attention=False, fused_norm=False,
                                                      fused_swiglu=False)
    return float(activations.activation_bytes_per_layer(
        parts, np.array(1 if modules else 0), precision, "attention-core",
        np.array(modules_mask(modules))))


def _row_statistics_bytes(spec, precision: str) -> float:
    """What activations.py leaves out of a module's figure: the two norms' per-row statistics
    (LayerNorm mean and rstd, RMSNorm rstd; fp32) and, in an fp32 run, the flash row
    statistics that activations.py counts twice (4asb)."""
    s = spec.seq_len
    stats = 2 * (2 if spec.norm is NormKind.LAYERNORM else 1) * B * s * 4
    lse = 4 * spec.num_heads * s * B if precision == "fp32" else 0
    return float(stats + lse)


def test_module_bits_agree_between_plan_table_and_cost_model() -> None:
    assert [1 << RC_MODULES.index(m) for m in (M.CORE_ATTN, M.MLP, M.LAYERNORM)] == [
        activations.CORE_ATTN, activations.MLP, activations.LAYERNORM]


@pytest.mark.parametrize("spec", [GPT, LLAMA_MHA], ids=["gpt", "llama-mha"])
@pytest.mark.parametrize("modules", MODULE_SETS, ids=lambda ms: "+".join(m.value for m in ms))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_saved_bytes_shrink_by_the_cost_models_module_figure(spec, modules, precision) -> None:
    """The measured drop (no recompute minus the modules) equals the cost model's drop within
    the per-row statistics it leaves out; the drop is at least one (b, s, h) tensor for mlp and
    layernorm, so a missing or extra activation cannot hide in the tolerance."""
    measured = _kept(spec, (), precision) - _kept(spec, modules, precision)
    predicted = _predicted(spec, (), precision) - _predicted(spec, modules, precision)
    slack = _row_statistics_bytes(spec, precision)
    one_tensor = B * spec.seq_len * spec.hidden_size * DTYPES[precision].itemsize
    assert slack < one_tensor
    if modules != (M.CORE_ATTN,):
        assert predicted >= one_tensor
    assert abs(measured - predicted) <= slack, (measured, predicted)


@pytest.mark.parametrize("modules", [(M.MLP,), (M.LAYERNORM,), (M.LAYERNORM, M.MLP)],
                         ids=["mlp", "layernorm", "layernorm+mlp"])
def test_grouped_query_attention_mlp_and_norm_figures(modules) -> None:
    """With grouped-query attention (whose repeated K/V the runtime keeps and activations.py does
    not count: the attention core is left out here) the MLP and norm figures still hold."""
    measured = _kept(LLAMA_GQA, (), "fp32") - _kept(LLAMA_GQA, modules, "fp32")
    predicted = _predicted(LLAMA_GQA, (), "fp32") - _predicted(LLAMA_GQA, modules, "fp32")
    assert abs(measured - predicted) <= _row_statistics_bytes(LLAMA_GQA, "fp32")


def _stack(spec, layers: int) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(spec.replace(num_layers=layers))
    model.embed = model.norm = model.output = None  # the blocks alone: (b, s, h) in and out
    return model


@pytest.mark.parametrize(("method", "num_layers", "kept_inputs"),
                         [(RecomputeMethod.UNIFORM, 2, 2), (RecomputeMethod.UNIFORM, 3, 2),
                          (RecomputeMethod.UNIFORM, 4, 1), (RecomputeMethod.BLOCK, None, 4)])
def test_uniform_keeps_one_input_per_group(method, num_layers, kept_inputs) -> None:
    """4 blocks: uniform keeps ceil(4 / k) group inputs (the cost model's uniform_groups), the
    block method one input per block."""
    model = _stack(GPT, 4)
    apply_recompute(model, RecomputePolicy.FULL, num_layers, method)
    x = torch.randn(B, GPT.seq_len, GPT.hidden_size, requires_grad=True)
    one_input = x.numel() * 4
    assert saved_bytes(_FreshInput(model), x) == kept_inputs * one_input


def _grads(spec, setup, steps: int = 2) -> list[torch.Tensor]:
    model = _stack(spec, 3)
    setup(model)
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        x = torch.randn(B, spec.seq_len, spec.hidden_size, generator=gen, requires_grad=True)
        model(x).square().mean().backward()
        out += [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
    return out


def _no_recompute(model) -> None:
    pass


def _modules(modules: tuple[RecomputeModule, ...]):
    return lambda model: apply_recompute(model, RecomputePolicy.SELECTIVE, None, modules=modules)


VARIANTS = {
    **{"+".join(m.value for m in ms): _modules(ms) for ms in MODULE_SETS},
    "uniform-2": lambda model: apply_recompute(model, RecomputePolicy.FULL, 2,
                                               RecomputeMethod.UNIFORM),
}


@pytest.mark.parametrize("spec", [GPT, LLAMA_GQA], ids=["gpt", "llama-gqa"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_recompute_leaves_gradients_bitwise_equal(spec, variant) -> None:
    ref = _grads(spec, _no_recompute)
    got = _grads(spec, VARIANTS[variant])
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


def test_planted_bug_norm_input_for_its_output_is_caught(monkeypatch) -> None:
    """A discarding hook that hands backward the norm's input instead of re-running the norm
    leaves the loss unchanged but the GEMM weight gradients wrong: the check must see it."""
    def wrong_unpack(packed):
        if isinstance(packed, tuple):
            note, size, stride, offset = packed
            return note.args[0].as_strided(size, stride, offset)
        return packed

    ref = _grads(GPT, _no_recompute)
    monkeypatch.setattr(module_recompute._DiscardOutputs, "unpack", staticmethod(wrong_unpack))
    got = _grads(GPT, VARIANTS["layernorm"])
    assert not all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


def _module_checkpointed(block: nn.Module) -> bool:
    """apply_modules replaced the attention core's forward on the instance."""
    return "core" in vars(block.attention)


# (pp, vpp, schedule, recompute.num_layers) on 8 layers: per chunk, as the cost model counts
NUM_LAYERS_CASES = [(1, 1, "1f1b", None), (1, 1, "1f1b", 3), (2, 1, "1f1b", 1),
                    (2, 1, "1f1b", 4), (2, 2, "interleaved-1f1b", 1),
                    (2, 2, "interleaved-1f1b", 2)]


@pytest.mark.parametrize(("pp", "vpp", "schedule", "num_layers"), NUM_LAYERS_CASES)
def test_modules_cover_the_blocks_the_cost_model_prices(pp, vpp, schedule, num_layers) -> None:
    """selective + modules + num_layers N (search/space.py recompute_pairs emits it): the
    runtime checkpoints the modules of the first N blocks of each chunk, as many per pipeline
    rank as cost/rows.py recomputed_layers prices (it used to checkpoint every block)."""
    import dataclasses

    from autoplan.cost.estimate import default_runtime
    from autoplan.cost.rows import recomputed_layers, rows_of
    from autoplan.hardware import load_profile
    from autoplan.plan import Pipeline, Recompute, Schedule
    from autoplan.plan_rules import runtime_limits, validate_plan
    from autoplan.plan_table import plan_to_row
    from autoplan.runtime.models.transformer import build_meta_model
    from autoplan.runtime.pipeline_parallel import layers_per_stage, split_stage, stage_indices
    from tests.dist.parity import make_plan

    spec = GPT.replace(num_layers=8)
    rc = Recompute(policy=RecomputePolicy.SELECTIVE, num_layers=num_layers,
                   modules=(M.CORE_ATTN, M.MLP))
    plan = dataclasses.replace(make_plan(spec, pp=pp, gbs=8, mbs=2), recompute=rc,
                               pipeline=Pipeline(schedule=Schedule(schedule), vpp=vpp))
    assert not validate_plan(plan, spec) and not runtime_limits(plan, spec)
    rows = rows_of(plan_to_row(plan, spec), spec, "fp32",
                   default_runtime(load_profile(plan.cluster.profile)))
    meta = build_meta_model(spec, 0.0, 1)
    stages = pp * vpp if pp > 1 else 1
    counts = layers_per_stage(spec.num_layers, stages, None)
    for rank in range(pp):
        parts = [split_stage(meta, i, counts)
                 for i in (stage_indices(rank, pp, plan.pipeline) if pp > 1 else [0])]
        for part in parts:
            apply_recompute(part, rc.policy, rc.num_layers, rc.method, rc.modules)
        runtime = sum(_module_checkpointed(b) for part in parts for b in part.layers.values())
        priced = recomputed_layers(np.array([sum(counts[i] for i in (
            stage_indices(rank, pp, plan.pipeline) if pp > 1 else [0]))]), rows)
        assert runtime == int(priced[0]), (rank, runtime, priced)
        # the first N of each chunk, never a later one
        for part in parts:
            flags = [_module_checkpointed(b) for b in part.layers.values()]
            assert flags == sorted(flags, reverse=True)
