"""Dynamic loss scaling for fp16 with torch.amp.GradScaler, one skip decision for the whole job.

The loss is multiplied by the scale S before backward; after backward the gradients are unscaled
by GradScaler (fp32 gradients: FSDP2 reduces in fp32) and checked for inf/NaN. The decision to
skip the step must be the same on every rank, or the ranks' weights diverge: GradScaler only
sees this rank's optimizers, and its DTensor path only agrees within the gradient's mesh (dp or
tp, never pp), while ShardedGradScaler agrees per optimizer (a rank with two pipeline chunks
could step one and skip the other). So every rank unscales all its optimizers, the per-rank
flags are combined in one all_reduce(MAX) over the world, and the agreed flag is written back
into GradScaler's per-optimizer record; GradScaler.step then skips (or runs) every optimizer and
GradScaler.update halves S after an overflow, or doubles it after `growth_interval` clean steps.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 2000
"""GradScaler's defaults (Micikevicius et al. 2018 use the same back-off/growth schedule)."""


class LossScaler:
    """Owns a torch.amp.GradScaler; `multiplier` is the scale as a Python float for the loss."""

    def __init__(self, device_type: str, init_scale: float = INIT_SCALE,
                 growth_interval: int = GROWTH_INTERVAL) -> None:
        self.scaler = torch.amp.GradScaler(device_type, init_scale=init_scale,
                                           growth_interval=growth_interval)
        self.multiplier = float(init_scale)
        self.scaler.scale(torch.ones((), device=device_type))  # creates the scale tensor

    def loss_fn(self, fn):
        """`fn` with its loss multiplied by the current scale (powers of two: exact)."""

        def scaled(*args):
            return fn(*args) * self.multiplier

        return scaled

    def unscale_and_agree(self, optimizers: list[torch.optim.Optimizer]) -> bool:
        """Unscale every gradient; True if any rank found an inf/NaN (the same on all ranks)."""
        for opt in optimizers:
            self.scaler.unscale_(opt)
        records = [t for opt in optimizers for t in _found_inf(self.scaler, opt)]
        flag = torch.zeros(1, dtype=torch.float32)
        for t in records:
            flag = torch.maximum(flag, t.detach().reshape(1).float().cpu())
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        for t in records:
            t.copy_(flag.reshape(t.shape).to(t.device))
        return bool(flag.item() > 0)

    def step_and_update(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """optimizer.step() unless the agreed flag says overflow; then the scale's schedule."""
        for opt in optimizers:
            self.scaler.step(opt)
        self.scaler.update()
        self.multiplier = float(self.scaler.get_scale())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Scale and growth tracker as tensors (DCP saves them; the same on every rank)."""
        return {"scale": torch.tensor(self.multiplier, dtype=torch.float64),
                "growth_tracker": torch.tensor(self.scaler._get_growth_tracker(),
                                               dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        sd = self.scaler.state_dict()
        sd["scale"] = float(state["scale"])
        sd["_growth_tracker"] = int(state["growth_tracker"])
        self.scaler.load_state_dict(sd)
        self.scaler.scale(torch.ones((), device=self.scaler._device))
        self.multiplier = float(self.scaler.get_scale())


def _found_inf(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    # GradScaler keeps one flag tensor per device for each optimizer it unscaled (the record
    # ShardedGradScaler all-reduces per optimizer); an optimizer without gradients has none
    return list(scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
