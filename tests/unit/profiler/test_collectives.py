"""profiler.collectives: what a timed call does, and which kinds each group measures."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.profiler import collectives

FACTORIES = ("aten.empty", "aten.zeros", "aten.ones", "aten.full", "aten.new_", "aten.rand")


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_a_timed_call_allocates_nothing(one_rank, op) -> None:
    """The buffers are made once per kind and size, outside the clock: filling a fresh 64 MiB
    buffer takes ~28 ms on one core of the 2-core development host, timed inside a 64 MiB
    all-reduce that measured 73 ms with it and 63 ms without (2 ranks)."""
    buf, out = collectives._buffers(op, 1 << 16, 1, torch.device("cpu"))
    with _Ops() as ops:
        collectives._call(op, buf, out, 0)
    assert ops.names, "the call dispatched nothing"
    assert not [n for n in ops.names if n.startswith(FACTORIES)], ops.names


def test_send_recv_is_measured_over_two_ranks_only() -> None:
    """The cost model prices a pipeline send with the 2-rank table alone (comm.p2p_time_s):
    over 4 or 8 ranks the same pair was timed with the others idle, and never read."""
    assert collectives.measured_ops(2) == collectives.OPS
    for group in (4, 8):
        assert collectives.measured_ops(group) == tuple(
            op for op in collectives.OPS if op != "send_recv")
