"""Module-level recompute inside one block (Megatron-Core's recompute_modules).

core_attn, mlp and moe are normal checkpoints: Attention.core, the dense FeedForward and a MoE
block's whole MoE layer run under torch.utils.checkpoint, which keeps their inputs and re-runs
them in backward (mlp leaves a MoE block alone, as Megatron-Core does). layernorm and moe_act are Megatron's output-discarding
checkpoint (megatron/core/tensor_parallel/random.py, CheckpointWithoutOutput): each norm, or a
MoE block's expert activation (Experts.act), runs under a checkpoint (keeping its inputs), and
while the block's forward runs, a saved-tensor hook replaces every save of its output (the input
the next GEMMs keep for their weight gradients) by a note to re-run it from its inputs when
backward asks for it. Forwards are replaced on the instances, so names (FQNs) do not change.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autoplan.plan import RecomputeModule
from autoplan.runtime.models.layers import FeedForward
from autoplan.runtime.models.moe import MoE


class _Remade:
    """An output discarded in forward: re-made once from its function's inputs in backward."""

    def __init__(self, fn: Callable[..., torch.Tensor], args: tuple[Any, ...],
                 y: torch.Tensor) -> None:
        self.fn, self.args, self.offset = fn, args, y.storage_offset()
        base = y if y._base is None else y._base
        self.base = weakref.ref(base)  # weak: the output itself is what we free
        self.value: torch.Tensor | None = None

    def matches(self, t: torch.Tensor) -> bool:
        """`t` is the output or a view of it (identity, never an address that may be reused)."""
        base = self.base()
        return base is not None and (t is base or t._base is base)

    def get(self) -> torch.Tensor:
        if self.value is None:
            with torch.no_grad():
                self.value = self.fn(*self.args)
        return self.value


class _DiscardOutputs:
    """saved_tensors_hooks for one block forward: saves of a registered output (or a view of
    it) become (note, size, stride, offset)."""

    def __init__(self) -> None:
        self.outputs: list[_Remade] = []

    def pack(self, t: torch.Tensor) -> Any:
        if type(t) is torch.Tensor:
            for note in self.outputs:
                if note.matches(t):
                    return (note, t.size(), t.stride(), t.storage_offset() - note.offset)
        return t

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, tuple):
            note, size, stride, offset = packed
            return note.get().as_strided(size, stride, offset)
        return packed


def _discarding(block: nn.Module, owner: nn.Module, name: str,
                wrap: Callable[..., Any]) -> None:
    """Replace owner.<name> (a norm's forward, the experts' act) by a checkpointed run whose
    output the block's saved-tensor hook discards (_discarding_block)."""
    original = getattr(owner, name)
    run = wrap(original)

    def discarded(*args: Any) -> torch.Tensor:
        y = run(*args)
        hooks = getattr(block, "_discard_outputs", None)
        if hooks is not None and any(isinstance(a, torch.Tensor) and a.requires_grad
                                     for a in args):
            hooks.outputs.append(_Remade(original, args, y))
        return y

    setattr(owner, name, discarded)  # an instance attribute shadows the method


def _discarding_block(block: nn.Module) -> None:
    original = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        hooks = _DiscardOutputs()
        block._discard_outputs = hooks  # type: ignore[assignment]
        try:
            with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
                return original(*args, **kwargs)
        finally:
            block._discard_outputs = None  # type: ignore[assignment]

    block.forward = forward  # type: ignore[method-assign]


def apply_modules(block: nn.Module, modules: frozenset[RecomputeModule],
                  wrap: Callable[..., Any]) -> None:
    """Checkpoint `modules` of one runtime Block in place; `wrap(fn)` returns fn under
    torch.utils.checkpoint (recompute.checkpoint_fn)."""
    if RecomputeModule.CORE_ATTN in modules:
        attn = block.attention
        attn.core = wrap(attn.core)  # an instance attribute shadows the method
    if RecomputeModule.MLP in modules and isinstance(block.feed_forward, FeedForward):
        ffn = block.feed_forward
        ffn.forward = wrap(ffn.forward)  # type: ignore[method-assign]
    if RecomputeModule.MOE in modules and isinstance(block.feed_forward, MoE):
        # router, dispatch (all-to-alls under expert parallelism), experts, combine and the
        # shared experts re-run in backward from the layer's input (MoELayer.forward under
        # tensor_parallel.checkpoint); aux-free load counting skips the re-run (ExpertBias.count)
        layer = block.feed_forward
        layer.forward = wrap(layer.forward)  # type: ignore[method-assign]
    discards = False
    if RecomputeModule.LAYERNORM in modules:
        for norm in (block.attention_norm, block.ffn_norm):
            _discarding(block, norm, "forward", wrap)
        discards = True
    if RecomputeModule.MOE_ACT in modules and isinstance(block.feed_forward, MoE):
        _discarding(block, block.feed_forward.experts, "act", wrap)
        discards = True
    if discards:  # one hook for the block, whatever it discards
        _discarding_block(block)
