"""CPU offload: FSDP2's CPUOffloadPolicy for parameters, a host optimizer for the optimizer only.

- offload.params (with or without offload.optimizer): FSDP2's CPUOffloadPolicy. The sharded
  parameters, their gradients and therefore the optimizer state and the optimizer step live in
  host memory; FSDP2 copies each layer's shard to the device for its all-gather.
- offload.optimizer alone (ZeRO-Offload, Ren et al. 2021): parameters and gradients stay on the
  device (FSDP2 without an offload policy). HostOffloadOptimizer keeps an fp32 copy of each
  parameter shard (the master weights) and the optimizer state in host memory; each step copies
  the gradient shards to the host, steps a torch optimizer there and copies the updated shards
  back.

Pinned host memory and non_blocking copies need CUDA, so they are used only when CUDA is
available (pinning needs an accelerator, so FSDP2's default CPUOffloadPolicy(pin_memory=True)
fails on a CPU-only host; see torch.distributed.fsdp.CPUOffloadPolicy's documentation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autoplan.plan import Offload


def wants_offload(offload: Offload) -> bool:
    """Either plan flag needs FSDP2 (sharded states to offload)."""
    return offload.optimizer or offload.params


def host_optimizer(offload: Offload) -> bool:
    """Optimizer-only offload: the step runs on host copies (HostOffloadOptimizer)."""
    return offload.optimizer and not offload.params


def offload_policy(offload: Offload):  # -> OffloadPolicy
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not offload.params:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _host_like(t: torch.Tensor, pin: bool) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=torch.float32, device="cpu", pin_memory=pin)
    return out.copy_(t)


class HostOffloadOptimizer(torch.optim.Optimizer):
    """An optimizer over device parameters whose state and step live on the host.

    `make_inner` builds the torch optimizer over the host fp32 master copies of the local
    parameter shards. This object's param_groups hold the device parameters and its `state`
    holds the inner state wrapped as DTensors with each parameter's placements (host local
    tensors, no copy), so torch.distributed.checkpoint saves and reshards it like any FSDP2
    optimizer state; loading writes into the host tensors and refreshes the masters from the
    (already loaded) parameters.
    """

    def __init__(self, params: list[torch.nn.Parameter],
                 make_inner: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> None:
        params = list(params)
        self._pin = torch.cuda.is_available()
        self._masters = [_host_like(_local(p.detach()), self._pin) for p in params]
        self._host_grads = [torch.zeros_like(m, pin_memory=self._pin) for m in self._masters]
        self.inner = make_inner(self._masters)
        super().__init__(params, dict(self.inner.defaults))

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if closure is not None:
            raise ValueError("HostOffloadOptimizer does not take a closure")
        for outer, inner in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        params = self._params()
        on_device = False
        for p, m, g in zip(params, self._masters, self._host_grads, strict=True):
            if p.grad is None:
                m.grad = None
                continue
            local = _local(p.grad)
            on_device |= local.is_cuda
            g.copy_(local, non_blocking=self._pin)  # device -> host
            m.grad = g
        if on_device:
            torch.cuda.current_stream().synchronize()  # the gradients have reached the host
        self.inner.step()
        for p, m in zip(params, self._masters, strict=True):
            if m.grad is not None:
                _local(p.detach()).copy_(m, non_blocking=self._pin)  # host -> device
        self._expose_state()
        return None

    def _expose_state(self) -> None:
        for p, m in zip(self._params(), self._masters, strict=True):
            inner = self.inner.state.get(m)
            if inner:
                self.state[p] = {k: _wrap_like(p, v) for k, v in inner.items()}

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        """Copy loaded state into the host tensors (torch's version would move it to the
        parameters' device), then take the masters from the loaded parameters."""
        saved = [key for group in state_dict["param_groups"] for key in group["params"]]
        for group, loaded in zip(self.param_groups, state_dict["param_groups"], strict=True):
            group.update({k: v for k, v in loaded.items() if k != "params"})
        for key, p, m in zip(saved, self._params(), self._masters, strict=True):
            for name, value in state_dict["state"].get(key, {}).items():
                inner = self.inner.state[m]
                if not isinstance(value, torch.Tensor):
                    inner[name] = value
                elif name in inner:
                    inner[name].copy_(_local(value))
                else:
                    inner[name] = _local(value).detach().to("cpu", copy=True)
            with torch.no_grad():
                m.copy_(_local(p.detach()))
        self._expose_state()


def _wrap_like(p: torch.Tensor, value):
    """A host state tensor shaped like p's local shard, as a DTensor placed like p."""
    if not isinstance(value, torch.Tensor) or not hasattr(p, "to_local"):
        return value
    if value.shape != p.to_local().shape:
        return value  # scalar state such as Adam's step
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(value, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())
