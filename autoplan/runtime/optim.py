"""Optimizers (one per model chunk, as DCP's per-module state dicts need) and the gradient norm.

With `host_offload` the torch optimizer runs on host copies (offload.HostOffloadOptimizer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class OptimConfig:
    name: str = "adamw"
    """adamw | sgd."""
    lr: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    host_offload: bool = False
    """Optimizer state and master weights in host memory; the step runs there (ZeRO-Offload)."""


def _single_mesh(params: list[torch.Tensor]) -> bool:
    from torch.distributed.tensor import DTensor

    meshes = {p.device_mesh if isinstance(p, DTensor) else None for p in params}
    return len(meshes) == 1


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    params = [p for p in module.parameters() if p.requires_grad]
    if cfg.host_offload:
        from autoplan.runtime.offload import HostOffloadOptimizer

        return HostOffloadOptimizer(params, lambda host: _torch_optimizer(host, cfg))
    return _torch_optimizer(params, cfg)


def set_hyperparameters(optimizers: list[torch.optim.Optimizer], cfg: OptimConfig) -> None:
    """Put `cfg`'s lr and weight decay into every param group: a loaded optimizer state brings
    the saving run's, and a resumed run trains with the ones it was given (--lr)."""
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = cfg.lr
            group["weight_decay"] = cfg.weight_decay


def _torch_optimizer(params: list[torch.Tensor], cfg: OptimConfig) -> torch.optim.Optimizer:
    foreach = None if _single_mesh(params) else False  # foreach cannot mix meshes
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=foreach)
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=cfg.weight_decay,
        foreach=foreach,
    )


def _group_key(g: torch.Tensor) -> object:
    from torch.distributed.tensor import DTensor

    if isinstance(g, DTensor):
        return (id(g.device_mesh), tuple(g.placements))
    return None


def global_grad_norm(modules: list[nn.Module], pp_group,
                     skip: Iterable[torch.Tensor] = ()) -> float:
    """L2 norm of all gradients of the job: sharded grads are reduced within their mesh
    (DTensor), then squares are summed over pipeline ranks. `skip`: second copies of a tied
    weight (counted once, on the stage that holds the first)."""
    groups: dict[object, list[torch.Tensor]] = {}
    skipped = {id(p) for p in skip}
    for m in modules:
        for p in m.parameters():
            if p.grad is not None and id(p) not in skipped:
                groups.setdefault(_group_key(p.grad), []).append(p.grad)
    # on the parameters' device: `+=` of a CUDA norm into a CPU tensor raises, and NCCL
    # reduces only CUDA tensors
    device = next((p.device for m in modules for p in m.parameters()), torch.device("cpu"))
    total_sq = torch.zeros((), dtype=torch.float64, device=device)
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total_sq += norm.double().to(device) ** 2
    if pp_group is not None:
        dist.all_reduce(total_sq, group=pp_group)
    return math.sqrt(total_sq.item())


def reduce_partial_grads(modules: list[nn.Module]) -> None:
    """Sum partial gradients once per step. Under sequence parallelism the norm weights are
    replicated but see sequence shards, so their gradients come out Partial; left so, every
    later op on them (the norm, each AdamW update) would all-reduce them again."""
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.placement_types import Partial

    for m in modules:
        for p in m.parameters():
            g = p.grad
            if isinstance(g, DTensor) and any(isinstance(pl, Partial) for pl in g.placements):
                p.grad = g.redistribute(placements=[
                    Replicate() if isinstance(pl, Partial) else pl for pl in g.placements])


def clip_grads_(modules: list[nn.Module], max_norm: float, total_norm: float) -> None:
    coef = max_norm / (total_norm + 1e-6)
    if coef >= 1.0:
        return
    with torch.no_grad():
        for m in modules:
            for p in m.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
