"""Pipeline parallelism with torch.distributed.pipelining: manual stage split and schedules.

The model is cut into pp * vpp stages of consecutive layers (plan.pipeline.layers_per_stage, or
an even split with the remainder going to the first stages); a stage is a deep copy of the
meta-device model with every other layer, and the embedding / head where not its own, deleted,
so FQNs stay global. Stage placement on pipeline rank r:

- gpipe, 1f1b: stage r.
- interleaved-1f1b (vpp >= 1): stages r, r + pp, ... (looped).
- zero-bubble: vpp == 2 -> ZBVZeroBubble, stages r and 2pp - 1 - r (V shape);
  otherwise InterleavedZeroBubble with the looped placement.

Losses are computed per micro-batch on the last stage; the schedule scales gradients by
1/n_microbatches so they equal the gradient of the mean loss over the local batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from autoplan.plan import Pipeline, Schedule


def layers_per_stage(num_layers: int, num_stages: int, given: tuple[int, ...] | None) -> list[int]:
    """Layer counts of each of the num_stages stages, in pipeline order."""
    if given is not None:
        return list(given)
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if i < extra else 0) for i in range(num_stages)]


def stage_indices(pp_rank: int, pp: int, pipeline: Pipeline) -> list[int]:
    """Global stage indices held by pipeline rank `pp_rank` (see the module docstring)."""
    vpp = pipeline.vpp
    if pipeline.schedule == Schedule.ZERO_BUBBLE and vpp == 2:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(vpp)]


def split_stage(model: nn.Module, stage: int, counts: list[int]) -> nn.Module:
    """A copy of the (meta) model that keeps only `stage`'s layers; FQNs are unchanged."""
    part = copy.deepcopy(model)
    start = sum(counts[:stage])
    keep = {str(i) for i in range(start, start + counts[stage])}
    for key in list(part.layers.keys()):
        if key not in keep:
            del part.layers[key]
    if stage != 0:
        part.embed = None
    if stage != len(counts) - 1:
        part.norm = None
        part.output = None
    return part


def schedule_class(pipeline: Pipeline):
    from torch.distributed.pipelining import schedules as s

    if pipeline.schedule == Schedule.GPIPE:
        return s.ScheduleGPipe
    if pipeline.schedule == Schedule.ONE_F_ONE_B:
        return s.Schedule1F1B
    if pipeline.schedule == Schedule.INTERLEAVED_1F1B:
        return s.ScheduleInterleaved1F1B
    if pipeline.vpp == 2:
        return s.ScheduleZBVZeroBubble
    return s.ScheduleInterleavedZeroBubble


def build_schedule(
    parts: list[nn.Module],
    indices: list[int],
    num_stages: int,
    pp_group,
    device: torch.device,
    pipeline: Pipeline,
    n_microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """PipelineStage objects for this rank's parts and the plan's schedule over them."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    stages = [
        PipelineStage(part, idx, num_stages, device, group=pp_group)
        for part, idx in zip(parts, indices, strict=True)
    ]
    cls = schedule_class(pipeline)
    if issubclass(cls, PipelineScheduleSingle):
        return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)


def stage_owner(stage: int, pp: int, pipeline: Pipeline) -> int:
    """The pipeline rank that holds global stage `stage`."""
    return next(r for r in range(pp) if stage in stage_indices(r, pp, pipeline))
