"""HostOffloadOptimizer (optimizer-only offload) against the torch optimizer it wraps."""

from __future__ import annotations

import pytest
import torch

from autoplan.plan import Offload
from autoplan.runtime.offload import HostOffloadOptimizer, host_optimizer, offload_policy
from autoplan.runtime.optim import OptimConfig, build_optimizer


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[float]:
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 8, generator=gen)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_host_step_is_bitwise_the_torch_step(name):
    ref, off = _model(), _model()
    cfg = OptimConfig(name=name, lr=1e-2)
    ref_opt = build_optimizer(ref, cfg)
    off_opt = build_optimizer(off, OptimConfig(name=name, lr=1e-2, host_offload=True))
    assert isinstance(off_opt, HostOffloadOptimizer)
    assert _train(ref, ref_opt, 4) == _train(off, off_opt, 4)
    for a, b in zip(ref.parameters(), off.parameters(), strict=True):
        assert torch.equal(a, b)
    # the state is the host copy's, under the device parameters (what DCP saves)
    ref_sd, off_sd = ref_opt.state_dict(), off_opt.state_dict()
    assert ref_sd["param_groups"] == off_sd["param_groups"]
    for i, st in ref_sd["state"].items():
        assert all(torch.equal(v, off_sd["state"][i][k]) for k, v in st.items())


def test_host_state_loads_and_masters_follow_the_parameters():
    src, dst = _model(), _model()
    src_opt = build_optimizer(src, OptimConfig(lr=1e-2, host_offload=True))
    _train(src, src_opt, 3)
    dst_opt = build_optimizer(dst, OptimConfig(lr=1e-2, host_offload=True))
    dst.load_state_dict(src.state_dict())
    dst_opt.load_state_dict(src_opt.state_dict())  # also refreshes the host masters
    assert _train(src, src_opt, 2) == _train(dst, dst_opt, 2)


def test_offload_flags_map_to_fsdp_policy_or_host_optimizer():
    from torch.distributed.fsdp import CPUOffloadPolicy

    assert host_optimizer(Offload(optimizer=True)) and not host_optimizer(Offload(True, True))
    assert not isinstance(offload_policy(Offload(optimizer=True)), CPUOffloadPolicy)
    assert isinstance(offload_policy(Offload(params=True)), CPUOffloadPolicy)
