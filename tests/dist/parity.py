"""Run one plan on the worker pool and compare it with the single-process reference."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np

from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind, load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Precision, Schedule

RTOL = 1e-5
ADAM_LR = 2e-4
"""AdamW lr of parity runs: small enough that round-off, which Adam scales per element, keeps
the trajectories within 1e-5 over 10 steps; SGD runs use lr 0.05."""
GRAD_ATOL = 1e-7
"""Absolute floor on a gradient's error norm, for gradients that are zero in exact arithmetic."""
SHIFT_INVARIANT = ("attention.wk.bias",)
"""Parameters whose exact gradient is zero (softmax ignores a constant added to every score, and
a key bias adds q.b to every score of a row): their gradients are round-off, which Adam scales
to lr-sized steps, so their values after training are not compared."""


TEST_MODELS = {
    # 8 heads and few layers: tp = 8 and dp = 8 rows at the lowest cost
    "h8-2l": ModelSpec(name="h8-2l", num_layers=2, hidden_size=64, num_heads=8,
                       vocab_size=256, seq_len=32),
    "llama-h8kv4-4l": ModelSpec(name="llama-h8kv4-4l", num_layers=4, hidden_size=64,
                                num_heads=8, num_kv_heads=4, ffn_hidden_size=128,
                                vocab_size=256, seq_len=32, mlp=MlpKind.SWIGLU,
                                norm=NormKind.RMSNORM, position=PositionKind.ROPE, bias=False),
    # 8 layers and 8 heads so that pp = 8 and tp = 8 are possible on 8 ranks
    "tiny8-gpt": ModelSpec(name="tiny8-gpt", num_layers=8, hidden_size=64, num_heads=8,
                           vocab_size=256, seq_len=32),
    "tiny8-llama": ModelSpec(name="tiny8-llama", num_layers=8, hidden_size=64, num_heads=8,
                             num_kv_heads=4, ffn_hidden_size=128, vocab_size=256, seq_len=32,
                             mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM,
                             position=PositionKind.ROPE, bias=False),
    # tied embedding and head (GPT-2/3 presets tie them)
    "tiny-tied": ModelSpec(name="tiny-tied", num_layers=4, hidden_size=64, num_heads=4,
                           vocab_size=256, seq_len=64, tie_embeddings=True),
    # an odd vocabulary (padded to 1024 rows: a multiple of 128*tp for tp 1, 2, 4, 8), untied and
    # tied, as GPT-3's 50257 under the README's tp 4 winner
    "odd-vocab": ModelSpec(name="odd-vocab", num_layers=2, hidden_size=64, num_heads=4,
                           vocab_size=1001, seq_len=32),
    "odd-vocab-tied": ModelSpec(name="odd-vocab-tied", num_layers=2, hidden_size=64,
                                num_heads=4, vocab_size=1001, seq_len=32, tie_embeddings=True),
    "tiny-llama-tied": ModelSpec(name="tiny-llama-tied", num_layers=4, hidden_size=64,
                                 num_heads=4, num_kv_heads=2, ffn_hidden_size=176,
                                 vocab_size=256, seq_len=64, mlp=MlpKind.SWIGLU,
                                 norm=NormKind.RMSNORM, position=PositionKind.ROPE, bias=False,
                                 tie_embeddings=True),
}


def make_plan(model: str = "tiny", dp: int = 1, tp: int = 1, pp: int = 1, *, cp: int = 1,
              sp: bool = False,
              schedule: str = "1f1b", vpp: int = 1, zero: int = 0, offload: bool = False,
              recompute: str = "none", recompute_layers: int | None = None, mbs: int = 2,
              gbs: int = 8, layers_per_stage: tuple[int, ...] | None = None,
              precision: str = "fp32", offload_params: bool | None = None,
              attention: str = "flash", dp_shard: int | None = None,
              grad_reduce: str | None = None) -> Plan:
    """`offload` sets both offload flags unless `offload_params` is given (optimizer only);
    `dp_shard` is HSDP's shard group, `grad_reduce` the gradient reduce dtype."""
    from autoplan.plan import Attention, Offload, Recompute, RecomputePolicy, ReduceDtype

    params = offload if offload_params is None else offload_params

    return Plan(
        model=TEST_MODELS.get(model, model),
        cluster=ClusterRef(profile="cpu-gloo", num_gpus=dp * tp * pp * cp),
        batch=Batch(micro_batch_size=mbs, global_batch_size=gbs),
        parallel=Parallel(dp=dp, tp=tp, pp=pp, cp=cp, dp_shard=dp_shard),
        sequence_parallel=sp,
        pipeline=Pipeline(schedule=Schedule(schedule), vpp=vpp,
                          layers_per_stage=layers_per_stage),
        zero_stage=zero,
        offload=Offload(optimizer=offload, params=params),
        recompute=Recompute(policy=RecomputePolicy(recompute), num_layers=recompute_layers),
        precision=Precision(precision),
        attention=Attention(attention),
        grad_reduce_dtype=None if grad_reduce is None else ReduceDtype(grad_reduce),
    )


def reference_plan(plan: Plan) -> Plan:
    """The same model, batch and precision on one process, no parallelism or recompute."""
    return make_plan(
        plan.model,
        mbs=plan.batch.micro_batch_size, gbs=plan.batch.global_batch_size,
        precision=plan.precision.value,
    )


def run_plan_rank(rank: int, world_size: int, plan: Plan, steps: int, optim_name: str,
                  capture: tuple[int, ...], bug: str | None, dropout: float = 0.0,
                  clip: float = 0.0, router: str = "token-index") -> dict:
    """Per-rank body: train `steps` steps; return losses, full grads at `capture` steps and
    full final parameters (numpy, keyed by clean FQN). `router`: of MoE layers (token-index: a
    fixed assignment, so a near-tie of router scores cannot send a token elsewhere)."""
    import torch

    from autoplan.runtime.data import SyntheticTokens, local_batch
    from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer
    from tests.dist import bugs

    spec = load_model(plan.model)
    dims = ParallelDims.from_plan(plan)
    assert dims.world_size == world_size
    lr = 0.05 if optim_name == "sgd" else ADAM_LR
    with bugs.planted(bug) if bug else contextlib.nullcontext():
        mesh = build_mesh(dims, "cpu")
        options = RuntimeOptions(dropout=dropout, moe_router=router)
        pm = parallelize(plan, spec, mesh, torch.device("cpu"), options)
        trainer = Trainer(pm, OptimConfig(name=optim_name, lr=lr, max_grad_norm=clip))
        source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)
        grads: dict[int, dict[str, np.ndarray]] = {}

        def hook(tr: Trainer, step: int) -> None:
            if step in capture:
                grads[step] = full_values(tr.pm.parts, grad=True, vocab=spec.vocab_size)

        losses = []
        for step in range(1, steps + 1):
            x, y = local_batch(source, step, plan.batch.global_batch_size, dims.dp,
                               dp_rank(mesh, dims))
            losses.append(trainer.train_step(x, y, grad_hook=hook).loss)
        params = full_values(pm.parts, grad=False, vocab=spec.vocab_size)
    return {"losses": losses, "grads": grads, "params": params}


VOCAB_FQNS = ("embed.tok.weight", "output.weight")


def one_step_setup(plan: Plan) -> tuple[Any, Any, Any, ModelSpec]:
    """On a forked rank: `plan` parallelised on this rank's CPU mesh with SGD, and this rank's
    first batch: (trainer, x, y, spec), for tests that watch one train_step's ops."""
    import torch

    from autoplan.runtime.data import SyntheticTokens, local_batch
    from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer

    spec = load_model(plan.model)
    dims = ParallelDims.from_plan(plan)
    mesh = build_mesh(dims, "cpu")
    pm = parallelize(plan, spec, mesh, torch.device("cpu"), RuntimeOptions())
    trainer = Trainer(pm, OptimConfig(name="sgd", lr=0.05))
    source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)
    x, y = local_batch(source, 1, plan.batch.global_batch_size, dims.dp, dp_rank(mesh, dims))
    return trainer, x, y, spec


def full_values(parts: list[Any], grad: bool, vocab: int | None = None) -> dict[str, np.ndarray]:
    """Gathered full parameters (or gradients) of this rank's chunks, by clean FQN; with
    `vocab`, the embedding and head without their padding rows (whose count depends on tp),
    after checking that the padding rows are zero (they must never train)."""
    from autoplan.runtime.names import clean_fqn

    out = {}
    for part in parts:  # remove_duplicate=False: a tied head shows under its own name too
        for name, p in part.named_parameters(remove_duplicate=False):
            t = p.grad if grad else p.detach()
            if t is None:
                continue
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            value = t.detach().float().numpy().copy()
            name = clean_fqn(name)
            if vocab is not None and name in VOCAB_FQNS:
                assert not value[vocab:].any(), f"{name}: padding rows {vocab}: are not zero"
                value = value[:vocab]
            out[name] = value
    return out


def merge_ranks(results: list[dict]) -> dict:
    merged: dict[str, Any] = {"losses": results[0]["losses"], "grads": {}, "params": {}}
    for res in results:
        for step, g in res["grads"].items():
            merged["grads"].setdefault(step, {}).update(g)
        merged["params"].update(res["params"])
    return merged


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(run: dict, ref: dict, rtol: float = RTOL, param_atol: float = 0.0) -> list[str]:
    """Every mismatch between a run and the reference, beyond `rtol`, as a message."""
    problems = []
    for i, (a, b) in enumerate(zip(run["losses"], ref["losses"], strict=True)):
        if abs(a - b) > rtol * abs(b):
            problems.append(f"loss at step {i + 1}: {a!r} vs reference {b!r}")
    for step, ref_g in ref["grads"].items():
        got = run["grads"].get(step, {})
        if set(got) != set(ref_g):
            problems.append(f"step {step} grads: names differ {sorted(set(got) ^ set(ref_g))}")
            continue
        for name, g in ref_g.items():
            a = got[name]
            if a.shape != g.shape:
                problems.append(f"grad {name} at step {step}: shape {a.shape} vs {g.shape}")
            elif np.linalg.norm(a - g) > rtol * np.linalg.norm(g) + GRAD_ATOL:
                problems.append(f"grad {name} at step {step}: rel err {rel_err(a, g):.3g}")
    for name, p in ref["params"].items():
        if name.endswith(SHIFT_INVARIANT):
            continue
        q = run["params"].get(name)
        if q is None or q.shape != p.shape:
            problems.append(f"param {name} missing or misshapen after the last step")
        elif np.linalg.norm(q - p) > rtol * np.linalg.norm(p) + param_atol * np.sqrt(p.size):
            problems.append(f"param {name} after the last step: rel err {rel_err(q, p):.3g}")
    return problems


def run_parity(pool, plan: Plan, steps: int = 10, optim: str = "adamw",
               capture: tuple[int, ...] = (1, 10), bug: str | None = None,
               timeout_s: float = 240.0, dropout: float = 0.0, clip: float = 0.0,
               router: str = "token-index") -> dict:
    results = pool.run(run_plan_rank, plan.world_size, plan, steps, optim, capture, bug,
                       dropout, clip, router, timeout_s=timeout_s)
    return merge_ranks(results)


def with_model(plan: Plan, **changes: Any) -> Plan:
    return dataclasses.replace(plan, **changes)


def attention_shards(rank: int, world_size: int, model) -> tuple[dict, dict]:
    """One tp rank's attention parameters of `model` (on the meta device, tp = world_size):
    their local shapes and their placements, by name."""
    from autoplan.runtime import tensor_parallel
    from autoplan.runtime.mesh import ParallelDims, build_mesh
    from autoplan.runtime.models.transformer import build_meta_model

    built = build_meta_model(model, 0.0, world_size)
    tensor_parallel.apply_tp(built, build_mesh(ParallelDims(tp=world_size), "cpu")["tp"], True,
                             True)
    attn = built.layers["0"].attention
    return ({n: tuple(p.to_local().shape) for n, p in attn.named_parameters()},
            {n: str(p.placements[0]) for n, p in attn.named_parameters()})

