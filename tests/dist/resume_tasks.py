"""Per-rank bodies of the checkpoint/resume tests (run on the forked worker pool)."""

from __future__ import annotations

from autoplan.plan import Plan


def train_with_checkpoints(rank: int, world_size: int, plan: Plan, ckpt_dir: str,
                           resume: bool, last_step: int, save_at: tuple[int, ...],
                           inf_step: int | None = None) -> dict:
    """Optionally resume from the latest checkpoint in ckpt_dir, train to `last_step`, saving
    at `save_at`; returns the losses (and fp16 loss scales) of the steps run and the full final
    parameters. `inf_step`: plant an inf gradient on rank 0 at that step (fp16 overflow)."""
    import torch

    from autoplan.model_spec import load_model
    from autoplan.runtime.checkpoint import Checkpointer
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
    ckpt = Checkpointer(ckpt_dir, pm.parts, trainer.optimizers, tied=pm.tie_embeddings,
                        loss_scaler=pm.loss_scaler)
    resumed = None
    if resume:
        resumed = trainer.step = ckpt.load_newest(plan, spec)
    source = SyntheticTokens(spec.vocab_size, spec.seq_len, seed=0)
    if inf_step is not None and rank == 0:
        plant_overflow(trainer, inf_step)
    losses, scales = {}, {}
    while trainer.step < last_step:
        x, y = local_batch(source, trainer.step + 1, plan.batch.global_batch_size, dims.dp,
                           dp_rank(mesh, dims))
        res = trainer.train_step(x, y)
        losses[res.step], scales[res.step] = res.loss, res.loss_scale
        if res.step in save_at:
            ckpt.save(res.step)
    return {"losses": losses, "scales": scales, "resumed": resumed, "params": full_values(pm.parts, grad=False,
                                                                   vocab=spec.vocab_size)}


def plant_overflow(trainer, at_step: int) -> None:
    """After backward of step `at_step`, put an inf into this rank's first gradient (before
    the loss scaler unscales and checks them), as an fp16 overflow would."""
    original = trainer.forward_backward

    def forward_backward(inputs, labels):
        out = original(inputs, labels)
        if trainer.step == at_step:
            p = next(p for part in trainer.pm.parts for p in part.parameters()
                     if p.grad is not None)
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            g.view(-1)[0] = float("inf")
        return out

    trainer.forward_backward = forward_backward
