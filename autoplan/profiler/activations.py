"""Bytes one transformer block keeps for backward under each recompute policy, measured on the
runtime's own Block and recompute wrappers (autoplan.runtime.recompute).

A tensor kept for backward is either saved by autograd (seen by saved_tensors_hooks) or, under
selective recompute, cached by the checkpoint's dispatch mode, which autograd never sees: so we
also track every storage the forward creates and count those still alive after it. Storages are
counted once (views share them); parameters and the block's output are not activations.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autoplan.model_spec import ModelSpec
from autoplan.plan import RecomputePolicy
from autoplan.profiler.compute import DTYPES
from autoplan.profiler.layers import build_layer, layer_models
from autoplan.runtime.recompute import checkpoint_kwargs

COLUMNS = ("model", "mbs", "seq", "tp", "policy", "bytes")
"""One row of `measured.saved_activations.rows`: bytes one block keeps per micro-batch."""


class _LiveStorages(TorchDispatchMode):
    """Remembers every storage an operator returns (weakly), to see which outlive a forward."""

    def __init__(self) -> None:
        super().__init__()
        self.created: dict[int, tuple[weakref.ref[Any], int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                self.created[st.data_ptr()] = (weakref.ref(st), st.nbytes())
        return out


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages `module(x)` keeps alive for backward."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            kept[st.data_ptr()] = st.nbytes()
        return t

    live = _LiveStorages()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), live:
        out = module(x)
    out_ptr = out.untyped_storage().data_ptr()
    for ptr, (ref, nbytes) in live.created.items():
        if ref() is not None and ptr not in params and ptr != out_ptr:
            kept[ptr] = nbytes
    del out
    return sum(kept.values())


def backward_peak_bytes(blocks: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(bytes the forward of `blocks` on `x` leaves allocated, most bytes allocated at once
    during its backward), from the allocator's own events (torch.profiler with
    profile_memory), counted from the start of the forward. The parameters' gradients are
    allocated beforehand (a state, not activations), so only the gradient temporaries
    accumulated into them show. The backward starts from an x-wide gradient, as a model's
    head hands its last block one."""
    for p in blocks.parameters():
        p.grad = torch.zeros_like(p)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = blocks(x)
        with record_function(_BACKWARD):
            out.backward(torch.ones_like(out))
    del out
    events = prof.profiler.kineto_results.events()
    start = min(e.start_ns() for e in events if e.name() == _BACKWARD)
    allocs = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    alive = np.cumsum([n for _, n in allocs])
    backward = np.array([t >= start for t, _ in allocs], dtype=bool)
    after_forward = int(alive[~backward][-1]) if (~backward).any() else 0
    return after_forward, int(alive[backward].max())


_BACKWARD = "autoplan::backward_peak"


def block_with_policy(spec: ModelSpec, tp: int, policy: RecomputePolicy, device: torch.device,
                      dtype: torch.dtype) -> nn.Module:
    """One tp rank's runtime Block, wrapped as autoplan.runtime.recompute wraps it."""
    block = build_layer("block", spec, tp, device, dtype)
    if policy == RecomputePolicy.NONE:
        return block
    return checkpoint_wrapper(block, **checkpoint_kwargs(policy))


def measure_block(spec: ModelSpec, mbs: int, seq: int, tp: int, policy: RecomputePolicy,
                  device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes kept for backward, bytes of the block input) for one micro-batch."""
    block = block_with_policy(spec, tp, policy, device, dtype)
    x = torch.randn(mbs, seq, spec.hidden_size, device=device, dtype=dtype, requires_grad=True)
    return saved_bytes(block, x), x.numel() * x.element_size()


def saved_rows(device: torch.device, precision: str, quick: bool) -> list[list[object]]:
    """Rows (see COLUMNS) for both model families at one small shape, tp 1 and 2."""
    mbs, seq = (1, 1024) if device.type == "cuda" else (2, 128)
    dtype = DTYPES[precision]
    rows: list[list[object]] = []
    for fam, spec in layer_models(device, seq).items():
        for tp in (1, 2) if quick else (1, 2, 4):
            for policy in RecomputePolicy:
                nbytes, _ = measure_block(spec, mbs, seq, tp, policy, device, dtype)
                rows.append([fam, mbs, seq, tp, policy.value, nbytes])
    return rows
