"""MOE CHECKPOINTS: a tiny-moe checkpoint saved under ep 2 resumes under ep 1 and ep 4 (DCP
reshards the experts' (E, out, in) DTensors) and continues as the uninterrupted ep 2 run; one
saved under etp 2 (each expert's FFN split) resumes under ep 2, etp 1."""

from __future__ import annotations

import numpy as np
import pytest

from tests.dist.parity import RTOL
from tests.dist.test_moe_parity import moe_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]


def train_moe(rank: int, world_size: int, plan, ckpt_dir: str, resume: bool, last_step: int,
              save_at: tuple[int, ...]) -> dict:
    """Per-rank body: (resume,) train to last_step with SGD, saving at save_at; the losses of
    the steps run and the full final parameters."""
    import torch

    from autoplan.model_spec import load_model
    from autoplan.runtime.checkpoint import Checkpointer
    from autoplan.runtime.data import SyntheticTokens, local_batch
    from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer
    from tests.dist.parity import full_values

    spec = load_model(plan.model)
    dims = ParallelDims.from_plan(plan)
    mesh = build_mesh(dims, "cpu")
    options = RuntimeOptions(moe_router="token-index")
    pm = parallelize(plan, spec, mesh, torch.device("cpu"), options)
    trainer = Trainer(pm, OptimConfig(name="sgd", lr=0.05))
    ckpt = Checkpointer(ckpt_dir, pm.parts, trainer.optimizers)
    if resume:
        trainer.step = ckpt.load_newest(plan, spec)
    source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)
    losses = {}
    while trainer.step < last_step:
        x, y = local_batch(source, trainer.step + 1, plan.batch.global_batch_size, dims.dp,
                           dp_rank(mesh, dims))
        res = trainer.train_step(x, y)
        losses[res.step] = res.loss
        if res.step in save_at:
            ckpt.save(res.step)
    return {"losses": losses, "params": full_values(pm.parts, grad=False, vocab=spec.vocab_size)}


def _merge(results):
    params = {}
    for r in results:
        params.update(r["params"])
    return results[0]["losses"], params


def test_ep2_checkpoint_resumes_under_ep1_and_ep4(pool, tmp_path):
    ep2 = moe_plan(ep=2, dp=2)
    straight, straight_params = _merge(pool.run(train_moe, 2, ep2, str(tmp_path / "a"), False,
                                                6, ()))
    pool.run(train_moe, 2, ep2, str(tmp_path / "b"), False, 3, (3,))
    for other in (moe_plan(ep=1, dp=2, zero=1), moe_plan(ep=4, dp=4, zero=3, mbs=1)):
        got, params = _merge(pool.run(train_moe, other.world_size, other, str(tmp_path / "b"),
                                      True, 6, ()))
        assert sorted(got) == [4, 5, 6]
        for step in (4, 5, 6):
            assert got[step] == pytest.approx(straight[step], rel=RTOL), (other.parallel, step)
        for name, p in straight_params.items():
            q = params[name]
            assert np.linalg.norm(q - p) <= RTOL * np.linalg.norm(p), (other.parallel, name)


def test_etp2_checkpoint_resumes_under_ep2_etp1(pool, tmp_path):
    """Saved with the experts' FFN dimension split over etp 2 (expert-DP 1), resumed with whole
    experts split over ep 2: DCP reshards both dimensions of the (E, out, in) weights."""
    etp2, ckpt = moe_plan(etp=2, dp=2), str(tmp_path / "ckpt")
    # one run saves at step 2 and goes on to step 4 (saving leaves the training unchanged)
    straight, straight_params = _merge(pool.run(train_moe, 2, etp2, ckpt, False, 4, (2,)))
    ep2 = moe_plan(ep=2, dp=2)
    got, params = _merge(pool.run(train_moe, 2, ep2, ckpt, True, 4, ()))
    assert sorted(got) == [3, 4]
    for step in (3, 4):
        assert got[step] == pytest.approx(straight[step], rel=RTOL), step
    assert set(params) == set(straight_params)
    for name, p in straight_params.items():
        assert np.linalg.norm(params[name] - p) <= RTOL * np.linalg.norm(p), name
