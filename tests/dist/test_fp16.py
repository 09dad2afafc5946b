"""fp16 with dynamic loss scaling: multi-rank runs track the single-process fp16 run, and an
overflow on one rank makes every rank (over dp, tp and pp) skip the same step."""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist.parity import make_plan, rel_err, run_parity

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

FP16_LOSS_RTOL = 2e-5
"""Measured (5 layouts incl. dp2tp2pp2, 10 SGD/AdamW steps): losses within 3.2e-6 of the
one-process fp16 run. They differ at all because the fp16 matmuls sum in another order (tp
splits the reductions, dp and pp the batches), each rounding at 2^-11 = 4.9e-4 relative per
element, which the fp32 mean over 512 tokens averages down; 2e-5 leaves 6x headroom."""
FP16_GRAD_RTOL = 1e-2
"""Step-1 gradients (norm of the difference / norm): measured <= 1e-5 for dp and pp (fp32
reduction), <= 2.5e-3 under tp (fp16 partial sums of the row-parallel matmuls, ~5 fp16 ulps);
a dp-sum or a missing tied-gradient sum is off by O(1)."""
ZERO_GRAD = ("attention.wk.bias",)  # exact gradient 0: round-off only (see parity.py)


def test_fp16_multi_rank_tracks_single_process_fp16(pool):
    ref = run_parity(pool, make_plan(precision="fp16"), 5, "sgd", capture=(1,))
    for plan in (make_plan(dp=2, zero=2, precision="fp16"),
                 make_plan(tp=2, pp=2, sp=True, precision="fp16")):
        got = run_parity(pool, plan, 5, "sgd", capture=(1,))
        for a, b in zip(got["losses"], ref["losses"], strict=True):
            assert a == pytest.approx(b, rel=FP16_LOSS_RTOL), plan.parallel
        for name, g in ref["grads"][1].items():
            if not name.endswith(ZERO_GRAD):
                assert rel_err(got["grads"][1][name], g) < FP16_GRAD_RTOL, (plan.parallel, name)


def _overflow_rank(rank: int, world_size: int, plan, steps: int, inf_rank: int,
                   inf_step: int) -> dict:
    """Train with an inf planted in one gradient of `inf_rank` at `inf_step`; returns, per step,
    the loss scale used, whether the step was skipped, whether this rank's weights moved, and
    whether this rank's own gradients (before the job-wide agreement) held an inf."""
    import pytest as _pytest
    import torch

    from autoplan.model_spec import load_model
    from autoplan.runtime import loss_scaling
    from autoplan.runtime.data import SyntheticTokens, local_batch
    from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer
    from tests.dist.resume_tasks import plant_overflow

    local_flags: list[bool] = []
    original_found_inf = loss_scaling._found_inf

    def found_inf(scaler, opt):  # read before unscale_and_agree's all-reduce overwrites it
        records = original_found_inf(scaler, opt)
        local_flags.append(any(float(t.sum()) > 0 for t in records))
        return records

    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(loss_scaling, "_found_inf", found_inf)
        spec = load_model(plan.model)
        dims = ParallelDims.from_plan(plan)
        mesh = build_mesh(dims, "cpu")
        pm = parallelize(plan, spec, mesh, torch.device("cpu"), RuntimeOptions())
        trainer = Trainer(pm, OptimConfig(name="sgd", lr=0.05))
        if rank == inf_rank:
            plant_overflow(trainer, inf_step)
        source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)

        def local(p):  # this rank's shard (torch.equal on DTensors would communicate)
            return p.detach().to_local() if hasattr(p, "to_local") else p.detach()

        out = []
        for step in range(1, steps + 1):
            before = [local(p).clone() for part in pm.parts for p in part.parameters()]
            x, y = local_batch(source, step, plan.batch.global_batch_size, dims.dp,
                               dp_rank(mesh, dims))
            local_flags.clear()
            res = trainer.train_step(x, y)
            after = [local(p) for part in pm.parts for p in part.parameters()]
            moved = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
            out.append((res.loss_scale, res.skipped, moved, any(local_flags)))
    return {"steps": out}


def test_planted_overflow_skips_the_same_step_on_every_rank(pool):
    """dp2 x tp2 x pp2: an inf in one gradient of rank 5 at step 2 is seen locally by only some
    ranks (GradScaler's DTensor path agrees within the gradient's dp x tp mesh, never over pp),
    yet every rank skips step 2, keeps its weights and halves the scale."""
    plan = make_plan(dp=2, tp=2, pp=2, zero=2, mbs=1, precision="fp16")
    ranks = [r["steps"] for r in pool.run(_overflow_rank, 8, plan, 3, 5, 2)]
    scale = 2.0**16
    for rank, steps in enumerate(ranks):
        decisions = [(s, skipped, moved) for s, skipped, moved, _ in steps]
        assert decisions == [(scale, False, True), (scale, True, False),
                             (scale / 2, False, True)], rank
        assert not steps[0][3] and not steps[2][3], rank
    saw_inf = {rank: steps[1][3] for rank, steps in enumerate(ranks)}
    assert saw_inf[5] and not all(saw_inf.values()), saw_inf  # local views disagree


def test_fp16_resume_restores_the_loss_scale(pool, tmp_path):
    """A step-3 checkpoint taken after an overflow halved the scale resumes bitwise."""
    from tests.dist.resume_tasks import train_with_checkpoints

    plan = make_plan(precision="fp16")
    straight = pool.run(train_with_checkpoints, 1, plan, str(tmp_path / "a"), False, 6, (),
                        2)[0]
    pool.run(train_with_checkpoints, 1, plan, str(tmp_path / "b"), False, 3, (3,), 2)
    resumed = pool.run(train_with_checkpoints, 1, plan, str(tmp_path / "b"), True, 6, ())[0]
    assert straight["scales"][4] == 2.0**15  # the overflow at step 2 halved it
    for step in (4, 5, 6):
        assert resumed["losses"][step] == straight["losses"][step]
        assert resumed["scales"][step] == straight["scales"][step]
    for name, p in straight["params"].items():
        assert np.array_equal(resumed["params"][name], p), name
