"""Activation recomputation (checkpointing) with torch.utils.checkpoint, per block or module.

- full: the whole block is recomputed in backward; only its input is kept. Method block: the
  first `num_layers` blocks of each model chunk (None: all); method uniform: every block, in
  checkpointed groups of `num_layers` consecutive blocks, keeping only each group's input
  (Megatron-LM's --recompute-method uniform).
- selective: matmul outputs (and the TP collectives' results) are saved, element-wise ops,
  norms and the attention core (softmax(QK^T)V, the s^2 part) are recomputed (Korthikanti et
  al. 2022), via create_selective_checkpoint_contexts.
- selective with modules (Megatron-Core's --recompute-modules): core_attn, mlp and moe are
  normal checkpoints of Attention.core, the dense FeedForward and a MoE block's MoE layer;
  layernorm and moe_act checkpoint the norms or the experts' activation and discard their
  outputs (module_recompute.py); in the first `num_layers` blocks of each model chunk (None:
  all), the blocks the cost model prices (cost/rows.py recomputed_layers: num_layers per chunk).
The RNG state is saved and restored so recomputed dropout masks match. Module names (FQNs)
never change: modules are checkpointed by replacing their forward on the instance.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from autoplan.plan import RecomputeMethod, RecomputeModule, RecomputePolicy
from autoplan.runtime.module_recompute import apply_modules


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


def checkpoint_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` under torch.utils.checkpoint (non-reentrant) with checkpoint_kwargs' RNG setting."""
    kwargs = checkpoint_kwargs(RecomputePolicy.FULL)

    def run(*args: Any, **kw: Any) -> Any:
        return checkpoint(fn, *args, use_reentrant=False,
                          preserve_rng_state=bool(kwargs["preserve_rng_state"]), **kw)

    return run


def _run_groups(model: nn.Module, size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Transformer.run_layers for the uniform method: checkpoint `size` blocks at a time."""
    def run_group(h: torch.Tensor, *group: nn.Module) -> torch.Tensor:
        for layer in group:
            h = layer(h)
        return h

    def run_layers(h: torch.Tensor) -> torch.Tensor:
        layers = list(model.layers.values())
        for i in range(0, len(layers), size):
            h = checkpoint_fn(run_group)(h, *layers[i:i + size])
        return h

    return run_layers


def apply_recompute(model: nn.Module, policy: RecomputePolicy, num_layers: int | None,
                    method: RecomputeMethod = RecomputeMethod.BLOCK,
                    modules: tuple[RecomputeModule, ...] | None = None) -> int:
    """Apply one plan's recompute to `model.layers` (one model chunk) in place; returns how
    many blocks it touches: all of them for the uniform method, else the first `num_layers`
    (None: all), with modules as with the block method."""
    if policy == RecomputePolicy.NONE:
        return 0
    keys = list(model.layers.keys())
    if method == RecomputeMethod.UNIFORM and not modules:
        if keys:
            model.run_layers = _run_groups(model, max(1, num_layers or 1))
        return len(keys)
    count = len(keys) if num_layers is None else min(num_layers, len(keys))
    if modules:
        for key in keys[:count]:
            apply_modules(model.layers[key], frozenset(modules), checkpoint_fn)
        return count
    for key in keys[:count]:
        model.layers[key] = checkpoint_wrapper(model.layers[key], **checkpoint_kwargs(policy))
    return count
