"""Activation recomputation (checkpointing) per transformer block with torch.utils.checkpoint.

- full: the whole block is recomputed in backward; only its input is kept.
- selective: matmul outputs (and the TP collectives' results) are saved, element-wise ops,
  norms and the attention core (softmax(QK^T)V, the s^2 part) are recomputed (Korthikanti et
  al. 2022), via create_selective_checkpoint_contexts.
Only the first `num_layers` blocks of each model chunk are wrapped (Megatron's "block" method);
None wraps all. The RNG state is saved and restored so recomputed dropout masks match.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from autoplan.plan import RecomputePolicy


@functools.cache
def _saved_ops() -> frozenset[object]:
    """Built once: the policy runs for every forward op, where rebuilding this set cost about
    as much as the op itself on CPU."""
    ops: set[object] = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None:  # results of TP collectives: recomputing them would re-communicate
        ops |= {c10d.reduce_scatter_tensor.default, c10d.all_reduce.default}
    return frozenset(ops)


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if op in _saved_ops():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_kwargs(policy: RecomputePolicy) -> dict[str, object]:
    """Keyword arguments for checkpoint_wrapper for one policy."""
    kwargs: dict[str, object] = {
        "checkpoint_impl": CheckpointImpl.NO_REENTRANT,
        "preserve_rng_state": True,
    }
    if policy == RecomputePolicy.SELECTIVE:
        kwargs["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _selective_policy
        )
    return kwargs


def apply_recompute(model: nn.Module, policy: RecomputePolicy, num_layers: int | None) -> int:
    """Wrap the first `num_layers` blocks of `model.layers` in place; returns how many."""
    if policy == RecomputePolicy.NONE:
        return 0
    keys = list(model.layers.keys())
    count = len(keys) if num_layers is None else min(num_layers, len(keys))
    for key in keys[:count]:
        model.layers[key] = checkpoint_wrapper(model.layers[key], **checkpoint_kwargs(policy))
    return count
