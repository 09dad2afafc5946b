"""One training step over a ParallelModel: micro-batches (or the pipeline schedule), the global
loss, the tied-embedding gradient sum, fp16 unscaling and the job-wide overflow check, the
gradient norm, clipping and the optimizer step (skipped on every rank after an overflow).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from autoplan.runtime.models.aux_free import update_expert_biases
from autoplan.runtime.optim import (
    OptimConfig,
    build_optimizer,
    clip_grads_,
    global_grad_norm,
    reduce_partial_grads,
)
from autoplan.runtime.parallelize import ParallelModel

log = logging.getLogger(__name__)

GradHook = Callable[["Trainer", int], None]


@dataclass(frozen=True)
class StepResult:
    step: int
    loss: float
    grad_norm: float
    stop_requested: bool = False
    loss_scale: float | None = None
    """fp16: the loss scale this step ran with; None without loss scaling."""
    skipped: bool = False
    """fp16: the optimizer step was skipped (an inf/NaN gradient on some rank)."""


class Trainer:
    """Owns the optimizers of one rank and runs steps; the step counter starts at 0."""

    def __init__(self, pm: ParallelModel, optim: OptimConfig, seed: int = 0,
                 reseed: bool = True) -> None:
        self.pm = pm
        self.reseed = reseed
        if pm.host_optimizer:
            optim = dataclasses.replace(optim, host_offload=True)
        self.optim_cfg = optim
        self.seed = seed
        self.optimizers = [build_optimizer(part, optim) for part in pm.parts]
        self.step = 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self._pp_group = pm.mesh["pp"].get_group() if pm.dims.pp > 1 else None

    # -- forward and backward -------------------------------------------------------------
    def _loss_context(self):
        if self.pm.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _sync_context(self, part, last: bool):
        """Gradient reduction across micro-batches follows the ZeRO stage, as the cost model
        assumes (cost/memory.py, cost/estimate.py): ZeRO-0/1 reduce once, on the last
        micro-batch, and keep the gathered weights in between (one all-gather and one
        reduce-scatter per step, full gradients accumulated); ZeRO-2/3 reduce-scatter every
        micro-batch so gradients stay sharded, and ZeRO-3 also reshards the weights after
        each backward."""
        if self.pm.ddp and not last:
            return part.no_sync()
        if self.pm.fsdp:
            zero = self.pm.dims.zero_stage
            part.set_requires_gradient_sync(last or zero >= 2)
            part.set_reshard_after_backward(last or zero >= 3)
        return contextlib.nullcontext()

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Accumulate gradients of the mean loss over this rank's local batch; returns the local
        mean loss where this rank computes it (the last pipeline stage), else None.
        Under context parallelism each rank keeps its own chunks of the (b, s) batch."""
        pm = self.pm
        if pm.cp_layout is not None:
            inputs, labels = pm.cp_layout.shard(inputs), pm.cp_layout.shard(labels)
        with self._loss_context():
            if pm.schedule is not None:
                losses: list[torch.Tensor] = []
                args = (inputs,) if pm.has_first_stage else ()
                target = labels if pm.has_last_stage else None
                pm.schedule.step(*args, target=target, losses=losses)
                if not pm.has_last_stage:
                    return None
                return torch.stack([_plain(x) for x in losses]).mean() / self._loss_multiplier
            part = pm.parts[0]
            total = torch.zeros((), device=inputs.device)  # the loss's device (CUDA: in place)
            n = pm.n_microbatches
            for i, (x, y) in enumerate(zip(inputs.chunk(n), labels.chunk(n), strict=True)):
                with self._sync_context(part, last=i == n - 1):
                    loss = pm.loss_fn(part(x), y)
                    if n > 1:
                        loss = loss / n
                    if pm.loss_scaler is not None:
                        (loss * pm.loss_scaler.multiplier).backward()
                    else:
                        loss.backward()
                total += _plain(loss.detach())
            return total

    # -- one step ----------------------------------------------------------------------------
    def train_step(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        stop_flag: bool | Callable[[], bool] = False,
        grad_hook: GradHook | None = None,
    ) -> StepResult:
        """Run step `self.step + 1` on this rank's batch; returns the global mean loss.
        `stop_flag` (or a callable asked after backward) asks every rank to stop after it."""
        self.step += 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if self.reseed:  # dropout masks are a function of (seed, step, rank): resumable
            torch.manual_seed(self.seed * 1_000_003 + self.step * 8191 + rank)
        pm, scale = self.pm, self._loss_multiplier
        local = self.forward_backward(inputs, labels)
        if pm.dims.tp > 1:  # only sequence-parallel norms leave partial gradients
            reduce_partial_grads(pm.parts)
        if pm.tied is not None:
            pm.tied.sync_grads()  # before unscaling, the norm and clipping
        loss, stop = self._reduce_loss(local, stop_flag() if callable(stop_flag) else stop_flag)
        skipped = pm.loss_scaler is not None and pm.loss_scaler.unscale_and_agree(self.optimizers)
        norm = math.nan
        if not skipped:
            norm = global_grad_norm(pm.parts, self._pp_group,
                                    pm.tied.duplicates if pm.tied is not None else ())
            if self.optim_cfg.max_grad_norm > 0:
                clip_grads_(pm.parts, self.optim_cfg.max_grad_norm, norm)
        if grad_hook is not None:
            grad_hook(self, self.step)
        if pm.loss_scaler is not None:
            pm.loss_scaler.step_and_update(self.optimizers)  # skips every step after overflow
        else:
            for opt in self.optimizers:
                opt.step()
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        update_expert_biases(pm.parts, pm.mesh, pm.n_microbatches, skipped)  # aux-free MoE
        if skipped:
            log.warning("step %d: inf/NaN gradient at loss scale %g; optimizer step skipped, "
                        "scale now %g", self.step, scale, pm.loss_scaler.multiplier)
        return StepResult(self.step, loss, norm, stop,
                          loss_scale=scale if pm.loss_scaler is not None else None,
                          skipped=skipped)

    @property
    def _loss_multiplier(self) -> float:
        return self.pm.loss_scaler.multiplier if self.pm.loss_scaler is not None else 1.0

    def _reduce_loss(self, local: torch.Tensor | None, stop_flag: bool) -> tuple[float, bool]:
        """Mean of the local losses of all last-stage ranks, and whether any rank wants to stop,
        in one small all-reduce over the world."""
        buf = torch.zeros(3, dtype=torch.float64)
        if local is not None:
            buf[0], buf[1] = float(local.detach()), 1.0
        buf[2] = float(stop_flag)
        if self.world > 1:
            dist.all_reduce(buf)
        return float(buf[0] / buf[1]), bool(buf[2] > 0)


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor loss (loss_parallel) as a local replicated tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
