"""Per-rank bodies of the checkpoint/resume tests (run on the forked worker pool)."""

from __future__ import annotations

from autoplan.plan import Plan


def train_with_checkpoints(rank: int, world_size: int, plan: Plan, ckpt_dir: str,
                           resume: bool, last_step: int, save_at: tuple[int, ...]) -> dict:
    """Optionally resume from the latest checkpoint in ckpt_dir, train to `last_step`, saving
    at `save_at`; returns the losses of the steps run and the full final parameters."""
    import torch

    from autoplan.model_spec import load_model
    from autoplan.runtime.checkpoint import Checkpointer, latest_checkpoint
    from autoplan.runtime.data import SyntheticTokens, local_batch
    from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer
    from tests.dist.parity import ADAM_LR, full_values

    spec = load_model(plan.model)
    dims = ParallelDims.from_plan(plan)
    mesh = build_mesh(dims, "cpu")
    pm = parallelize(plan, spec, mesh, torch.device("cpu"), RuntimeOptions())
    trainer = Trainer(pm, OptimConfig(name="adamw", lr=ADAM_LR))
    ckpt = Checkpointer(ckpt_dir, pm.parts, trainer.optimizers)
    if resume:
        trainer.step = ckpt.load(latest_checkpoint(ckpt_dir))
    source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)
    losses = {}
    while trainer.step < last_step:
        x, y = local_batch(source, trainer.step + 1, plan.batch.global_batch_size, dims.dp,
                           dp_rank(mesh, dims))
        res = trainer.train_step(x, y)
        losses[res.step] = res.loss
        if res.step in save_at:
            ckpt.save(res.step)
    return {"losses": losses, "params": full_values(pm.parts, grad=False)}
