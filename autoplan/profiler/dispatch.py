"""Host-side cost per operator of eager PyTorch, of DTensor and of selective checkpointing.

Each is measured on the runtime's own transformer block at a size where the arithmetic is
negligible, divided by the block's operator count (aten ops, counted with a dispatch mode), so
the cost model can charge ops_per_layer x seconds per op (autoplan.cost.compute). On a GPU
the host issues them ahead of the device, so they cost only what a block's kernels do not cover
(RuntimeTraits.host_runs_ahead: small blocks); on a CPU nothing hides them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.profiler.compute import time_call

SEQ, BATCH = 8, 1
"""Tokens of the timed micro-batch: small enough that dispatch, not arithmetic, is timed."""


@dataclass(frozen=True)
class DispatchCosts:
    op_overhead_s: float
    """Seconds per aten op, forward or backward."""
    dtensor_op_overhead_s: float
    """Extra seconds per aten op when the block is tensor-parallel (DTensor)."""
    checkpoint_op_overhead_s: float
    """Extra seconds per forward aten op of a fully recomputed block, beyond the recomputation."""
    selective_op_overhead_s: float
    """Extra seconds per forward aten op of a selectively recomputed block, beyond recomputing
    its non-GEMM ops."""
    forward_ops: int
    backward_ops: int
    gemm_ops: int
    fsdp_unit_overhead_s: float = 0.0
    """Extra seconds per FSDP2 unit and micro-batch (forward + backward hooks, copies)."""
    optimizer_overhead_s: float = 0.0
    """Seconds per parameter tensor of the runtime's step after backward (gradient norm,
    AdamW, zero_grad) at a size where the arithmetic is negligible."""
    dtensor_optimizer_overhead_s: float = 0.0
    """Extra seconds per parameter tensor of that step over DTensor parameters."""


GEMMS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.")


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = self.gemms = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.gemms += str(func).startswith(GEMMS)
        return func(*args, **(kwargs or {}))


def _tiny_model():
    from autoplan.model_spec import load_model
    from autoplan.runtime.models.transformer import build_meta_model

    spec = load_model("tiny")
    return spec, build_meta_model(spec, 0.0)


CPU = torch.device("cpu")


def _materialize(model, spec, device: torch.device = CPU) -> None:
    from autoplan.runtime.models.init import materialize_and_init

    materialize_and_init(model, device, spec.num_layers, 0)


def _step(block: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        out = block(x)
        if hasattr(out, "to_local"):
            out = out.to_local()
        out.sum().backward()

    return run


def _count(block: torch.nn.Module, x: torch.Tensor) -> tuple[int, int, int]:
    """(forward ops, backward ops, forward GEMMs) of one forward + backward."""
    with _CountOps() as fwd:
        out = block(x)
    with _CountOps() as bwd:
        out.sum().backward()
    return fwd.count, bwd.count, fwd.gemms


def _dtensor_block_seconds(x: torch.Tensor, repeats: int) -> float:
    """Forward + backward of a tensor-parallel block over a one-rank mesh (no communication)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoplan.runtime.tensor_parallel import apply_tp

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        spec, model = _tiny_model()
        apply_tp(model, init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)), False, False)
        _materialize(model, spec)
        return time_call(_step(model.layers["0"], x), torch.device("cpu"), repeats, warmup=3)
    finally:
        if owned:
            dist.destroy_process_group()


def _training_seconds(tokens: torch.Tensor, repeats: int) -> list[tuple[float, float, int]]:
    """[(forward + backward s, step s, FSDP units)] of the tiny model, plain and with each
    block and the root a fully_shard unit over a one-rank mesh. The step is what the runtime
    does after backward: gradient norm, AdamW, zero_grad."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from autoplan.runtime.optim import global_grad_norm

    out = []
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for shard in (False, True):
            spec, model = _tiny_model()
            units = 0
            if shard:
                mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
                for block in model.layers.values():
                    fully_shard(block, mesh=mesh, reshard_after_forward=False)
                fully_shard(model, mesh=mesh, reshard_after_forward=False)
                units = len(model.layers) + 1
            _materialize(model, spec)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            backward = _step(model, tokens)

            def train_step(opt=opt, model=model, backward=backward) -> None:
                backward()
                global_grad_norm([model], None)
                opt.step()
                opt.zero_grad(set_to_none=True)

            whole = time_call(train_step, CPU, repeats, warmup=3)
            fb = time_call(backward, CPU, repeats, warmup=3)
            out.append((fb, whole - fb, units))
    finally:
        if owned:
            dist.destroy_process_group()
    return out


def _checkpointed_seconds(x: torch.Tensor, repeats: int, policy) -> float:
    """Forward + backward of the block under the runtime's own recompute wrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from autoplan.runtime.recompute import checkpoint_kwargs

    spec, model = _tiny_model()
    _materialize(model, spec)
    block = checkpoint_wrapper(model.layers["0"], **checkpoint_kwargs(policy))
    return time_call(_step(block, x), torch.device("cpu"), repeats, warmup=3)


def measure_dispatch(device: torch.device, quick: bool) -> DispatchCosts:
    """Per-op host costs of the runtime's block on `device` (see the module docstring). The
    DTensor, checkpoint and FSDP overheads are measured on CPU only; on a GPU they are host work
    that large kernels hide, and stay 0."""
    from autoplan.plan import RecomputePolicy

    repeats = 15 if quick else 60
    spec, model = _tiny_model()
    _materialize(model, spec, device)
    block = model.layers["0"]
    x = torch.randn(BATCH, SEQ, spec.hidden_size, device=device, requires_grad=True)
    fwd, bwd, gemms = _count(block, x)
    plain = time_call(_step(block, x), device, repeats, warmup=3)
    costs = DispatchCosts(plain / (fwd + bwd), 0.0, 0.0, 0.0, fwd, bwd, gemms)
    if device.type != "cpu":
        return costs
    forward = time_call(lambda: block(x), device, repeats, warmup=3)
    dtensor = _dtensor_block_seconds(x, repeats)
    full = _checkpointed_seconds(x, repeats, RecomputePolicy.FULL)
    selective = _checkpointed_seconds(x, repeats, RecomputePolicy.SELECTIVE)
    recomputed = forward * (fwd - gemms) / fwd  # selective recomputes all but the GEMMs
    (plain_fb, plain_step, _), (fsdp_fb, fsdp_step, units) = _training_seconds(
        torch.randint(0, spec.vocab_size, (BATCH, SEQ)), repeats)
    tensors = len(list(model.parameters()))
    return dataclasses.replace(
        costs,
        dtensor_op_overhead_s=max(dtensor - plain, 0.0) / (fwd + bwd),
        checkpoint_op_overhead_s=max(full - plain - forward, 0.0) / fwd,
        selective_op_overhead_s=max(selective - plain - recomputed, 0.0) / fwd,
        fsdp_unit_overhead_s=max(fsdp_fb - plain_fb, 0.0) / units,
        optimizer_overhead_s=max(plain_step, 0.0) / tensors,
        dtensor_optimizer_overhead_s=max(fsdp_step - plain_step, 0.0) / tensors,
    )


def apply_dispatch(prof: dict[str, Any], costs: DispatchCosts, device: torch.device) -> None:
    """Write the per-op host costs into a profile's efficiency section and `measured`."""
    names = ("op_overhead_s", "dtensor_op_overhead_s", "checkpoint_op_overhead_s",
             "selective_op_overhead_s", "fsdp_unit_overhead_s", "optimizer_overhead_s",
             "dtensor_optimizer_overhead_s")
    on_cpu = device.type == "cpu"
    for name in names:
        # a GPU hides host work behind kernels of real size: measured, kept, not charged
        prof["efficiency"][name] = float(getattr(costs, name)) if on_cpu else 0.0
    prof.setdefault("measured", {})["dispatch"] = {
        **{name: float(getattr(costs, name)) for name in names},
        "block_ops": [costs.forward_ops, costs.backward_ops, costs.gemm_ops],
    }
