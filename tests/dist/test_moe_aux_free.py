"""DEEPSEEK-V3 ROUTER PARITY: tiny-deepseek (sigmoid router over 4 groups of 2 experts, 2
groups per token, gates scaled by 2.5, the load-balancing bias moving 0.01 a step) under expert
parallelism matches one process over several steps (fp32 losses, gradients and parameters
within 1e-5) with the learned router, so the bias updates change the routing; every rank ends
with the same biases as the one process; a planted bug (the experts' loads not summed over the
data-parallel ranks: each rank balances its own tokens) leaves the ranks' biases apart. A
checkpoint saved under ep 2 restores the biases under one process. `-m slow` adds tp, cp, pp, ZeRO-3 with full recompute and plain DDP.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist.parity import RTOL, compare, reference_plan
from tests.dist.test_moe_parity import moe_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

MODEL = "tiny-deepseek"
STEPS = 4
LR = 0.05  # SGD


def train_rank(rank: int, world_size: int, plan, steps: int, bug: bool,
               ckpt_dir: str | None = None, save_at: int = 0, resume: bool = False) -> dict:
    """Per-rank body: SGD for `steps` steps with the learned router; losses, gradients at
    steps 1 and `steps`, full final parameters, and this rank's router biases. `bug`: the
    loads are not summed over the dp x cp ranks (each rank balances its own tokens)."""
    import contextlib

    import torch

    from autoplan.model_spec import load_model
    from autoplan.runtime.checkpoint import Checkpointer
    from autoplan.runtime.data import SyntheticTokens, local_batch
    from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank
    from autoplan.runtime.models import aux_free
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer
    from tests.dist.parity import full_values

    spec = load_model(plan.model)
    dims = ParallelDims.from_plan(plan)
    with pytest.MonkeyPatch.context() if bug else contextlib.nullcontext() as mp:
        if bug:
            mp.setattr(aux_free, "load_groups", lambda mesh: [])
        mesh = build_mesh(dims, "cpu")
        pm = parallelize(plan, spec, mesh, torch.device("cpu"), RuntimeOptions())
        trainer = Trainer(pm, OptimConfig(name="sgd", lr=LR))
        ckpt = Checkpointer(ckpt_dir, pm.parts, trainer.optimizers) if ckpt_dir else None
        if resume:
            trainer.step = ckpt.load_newest(plan, spec)
        source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)
        grads, losses = {}, []

        def hook(tr: Trainer, step: int) -> None:
            if step in (1, steps):
                grads[step] = full_values(tr.pm.parts, grad=True, vocab=spec.vocab_size)

        while trainer.step < steps:
            x, y = local_batch(source, trainer.step + 1, plan.batch.global_batch_size, dims.dp,
                               dp_rank(mesh, dims))
            losses.append(trainer.train_step(x, y, grad_hook=hook).loss)
            if ckpt is not None and trainer.step == save_at:
                ckpt.save(trainer.step)
        biases = {name: b.detach().numpy().copy() for part in pm.parts
                  for name, b in part.named_buffers() if name.endswith("balance.bias")}
        params = full_values(pm.parts, grad=False, vocab=spec.vocab_size)
    return {"losses": losses, "grads": grads, "params": params, "biases": biases}


def run(pool, plan, steps: int = STEPS, bug: bool = False, ckpt_dir: str | None = None,
        save_at: int = 0, resume: bool = False) -> list[dict]:
    """Every rank's result of train_rank."""
    return pool.run(train_rank, plan.world_size, plan, steps, bug, ckpt_dir, save_at, resume,
                    timeout_s=240.0)


def merged(results: list[dict]) -> dict:
    out = {"losses": results[0]["losses"], "grads": {}, "params": {}}
    for r in results:
        for step, g in r["grads"].items():
            out["grads"].setdefault(step, {}).update(g)
        out["params"].update(r["params"])
    return out


def bias_problems(results: list[dict], ref: dict[str, np.ndarray]) -> list[str]:
    """Ranks whose biases differ from rank 0's (exactly) or from the one process's."""
    problems = []
    for rank, r in enumerate(results):
        for name, want in ref.items():
            got = r["biases"].get(name)
            if got is None:  # a pipeline rank without this layer
                continue
            if rank and name in results[0]["biases"] and \
                    not np.array_equal(got, results[0]["biases"][name]):
                problems.append(f"rank {rank} {name} differs from rank 0's: {got} vs "
                                f"{results[0]['biases'][name]}")
            if np.linalg.norm(got - want) > RTOL * np.linalg.norm(want):
                problems.append(f"rank {rank} {name}: {got} vs one process {want}")
    return problems


def _reference(pool, reference_cache, plan, steps: int = STEPS) -> dict:
    key = ("aux-free", plan.batch, steps)
    if key not in reference_cache:
        [ref] = run(pool, reference_plan(plan), steps)
        assert any(np.abs(b).sum() > 0 for b in ref["biases"].values())
        reference_cache[key] = ref
    return reference_cache[key]


def _check(pool, reference_cache, plan, bug: bool = False) -> list[str]:
    ref = _reference(pool, reference_cache, plan)
    results = run(pool, plan, bug=bug)
    return compare(merged(results), ref) + bias_problems(results, ref["biases"])


EP2 = dict(ep=2, dp=2, mbs=4)
SAVE_AT = 2
SLOW_ROWS = {
    "ep2-dp2tp2-sp": dict(ep=2, dp=2, tp=2, sp=True),
    "ep2-cp2": dict(ep=2, cp=2),
    "ep2-dp2pp2": dict(ep=2, dp=2, pp=2),  # the pipeline's metadata inference not counted
    "ep2-dp2pp2-zbv-zero1": dict(ep=2, dp=2, pp=2, zero=1, schedule="zero-bubble", vpp=2,
                                 mbs=1),
    "ep2-dp2-zero3-full": dict(ep=2, dp=2, zero=3, recompute="full"),
    "ep2-dp2-selective": dict(ep=2, dp=2, recompute="selective"),
    "dp2-ddp": dict(dp=2),
}


@pytest.fixture(scope="module")
def ep2_run(pool, tmp_path_factory):
    """The ep 2 x dp 2 run, saving a checkpoint at SAVE_AT: (rank results, checkpoint dir)."""
    ckpt = tmp_path_factory.mktemp("aux-free-ckpt")
    return run(pool, moe_plan(model=MODEL, **EP2), ckpt_dir=str(ckpt), save_at=SAVE_AT), ckpt


def test_aux_free_router_matches_single_process(pool, reference_cache, ep2_run):
    ref = _reference(pool, reference_cache, moe_plan(model=MODEL, **EP2))
    results = ep2_run[0]
    problems = compare(merged(results), ref) + bias_problems(results, ref["biases"])
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_ROWS))
def test_aux_free_router_compositions_match_single_process(pool, reference_cache, name):
    problems = _check(pool, reference_cache, moe_plan(model=MODEL, **SLOW_ROWS[name]))
    assert not problems, "\n".join(problems[:20])


def test_loads_not_summed_over_dp_are_caught(pool, reference_cache):
    """Two steps suffice: the first update already moves each rank's biases its own way (the
    clean ranks agree exactly: test_aux_free_router_matches_single_process)."""
    broken = run(pool, moe_plan(model=MODEL, **EP2), steps=2, bug=True)
    problems = bias_problems(broken, broken[0]["biases"])
    assert any("differs from rank 0" in p for p in problems), problems[:5]


def test_checkpoint_restores_the_biases(pool, reference_cache, ep2_run):
    """Saved by DCP at step 2 under ep 2 (a buffer in the model state dict), loaded by one
    process, which continues to step 4 as the uninterrupted one process does."""
    plan = moe_plan(model=MODEL, **EP2)
    ref = _reference(pool, reference_cache, plan)
    [resumed] = run(pool, reference_plan(plan), ckpt_dir=str(ep2_run[1]), resume=True)
    assert len(resumed["losses"]) == STEPS - SAVE_AT
    for got, want in zip(resumed["losses"], ref["losses"][SAVE_AT:], strict=True):
        assert abs(got - want) <= RTOL * abs(want)
    assert not bias_problems([resumed], ref["biases"])
