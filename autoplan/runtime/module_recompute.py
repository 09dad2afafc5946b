"""Module-level recompute inside one block (Megatron-Core's recompute_modules).

core_attn and mlp are normal checkpoints: Attention.core and the dense FeedForward run under
torch.utils.checkpoint, which keeps their inputs and re-runs them in backward. layernorm is
Megatron's output-discarding checkpoint (megatron/core/tensor_parallel/random.py,
CheckpointWithoutOutput): each norm runs under a checkpoint (keeping its input), and while the
block's forward runs, a saved-tensor hook replaces every save of a norm's output (the input the
next GEMMs keep for their weight gradients) by a note to re-run the norm from its input when
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


class _Remade:
    """A norm output discarded in forward: re-made once from the norm's input in backward."""

    def __init__(self, norm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 y: torch.Tensor) -> None:
        self.norm, self.x, self.offset = norm, x, y.storage_offset()
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
                self.value = self.norm(self.x)
        return self.value


class _DiscardOutputs:
    """saved_tensors_hooks for one block forward: saves of a registered norm output (or a view
    of it) become (note, size, stride, offset)."""

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


def _discarding_norm(block: nn.Module, norm: nn.Module, wrap: Callable[..., Any]) -> None:
    original = norm.forward
    run = wrap(original)

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = run(x)
        hooks = getattr(block, "_discard_outputs", None)
        if hooks is not None and x.requires_grad:
            hooks.outputs.append(_Remade(original, x, y))
        return y

    norm.forward = forward  # type: ignore[method-assign]


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
    if RecomputeModule.LAYERNORM in modules:
        for norm in (block.attention_norm, block.ffn_norm):
            _discarding_norm(block, norm, wrap)
        _discarding_block(block)
