"""profiler.collectives: what a timed call does, and which kinds each group measures."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.profiler import collectives
from tests.process_state import running

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


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(("op", "runs_as"), [("reduce_scatter", "gloo:all_reduce"),
                                             ("all_gather", "gloo:all_gather"),
                                             ("all_reduce", "gloo:all_reduce")])
def test_gloo_runs_a_reduce_scatter_as_an_all_reduce(one_rank, op, runs_as) -> None:
    """What gloo_reduce_scatter_floor rests on: gloo's reduce_scatter_tensor is its all-reduce
    of the whole input (and a copy), so it cannot cost less. Should a torch release give gloo
    a reduce-scatter of its own, this fails and the floor goes."""
    from torch.profiler import profile

    buf, out = collectives._buffers(op, 1 << 12, 1, torch.device("cpu"))
    with profile() as prof:
        collectives._call(op, buf, out, 0)
    assert {e.name for e in prof.events() if e.name.startswith("gloo:")} == {runs_as}


def test_a_reduce_scatter_is_floored_at_the_all_reduce_beside_it() -> None:
    rows = {"all_reduce": [[1024.0, 3e-3], [4096.0, 2e-3]],
            "reduce_scatter": [[1024.0, 1e-3], [4096.0, 5e-3], [16384.0, 4e-3]],
            "all_gather": [[1024.0, 1e-3]]}
    floored = collectives.gloo_reduce_scatter_floor(rows)
    # raised where it read below; kept where above, or where no all-reduce was timed
    assert floored["reduce_scatter"] == [[1024.0, 3e-3], [4096.0, 5e-3], [16384.0, 4e-3]]
    assert floored["all_reduce"] == rows["all_reduce"]
    assert floored["all_gather"] == rows["all_gather"]
    assert rows["reduce_scatter"][0] == [1024.0, 1e-3]  # the measured rows are not edited


# `autoplan profile` whose benchmark ranks write their pids and hang: SIGTERM then arrives
# while the launcher waits for them (the GEMM and other phases are skipped)
HANGING_PROFILE = """
import os, sys, time
import autoplan.profiler.cli as cli
import autoplan.profiler.collectives as collectives
from autoplan.commands import main

def hang(rank, *_args):
    pid = os.path.join(sys.argv[1], f"rank{rank}.pid")
    open(pid + ".tmp", "w").write(str(os.getpid()))
    os.replace(pid + ".tmp", pid)
    time.sleep(120)

collectives._worker = hang
cli._measure = lambda req, console: collectives.measure_collectives(2, "cpu", True)
sys.exit(main(sys.argv[2:]))
"""


def test_sigterm_kills_the_benchmark_ranks_and_removes_the_temporary_folder(tmp_path) -> None:
    """SIGTERM used to end `autoplan profile` at once, leaving its ranks running and an
    autoplan-profile-* folder in the temporary directory."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    pids, temp, out = tmp_path / "pids", tmp_path / "tmp", tmp_path / "p.yaml"
    pids.mkdir()
    temp.mkdir()
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING_PROFILE, str(pids), "profile", "--device", "cpu",
         "--ranks", "2", "--quick", "--out", str(out)], cwd=root,
        env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.glob("rank*.pid"))) < 2:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.05)
        ranks = [int(p.read_text()) for p in pids.glob("rank*.pid")]
        assert list(temp.glob("autoplan-profile-*"))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert "stopped by SIGTERM" in err and len(err.strip().splitlines()) == 1, err
        time.sleep(0.2)
        assert not [pid for pid in ranks if running(pid)]
        assert list(temp.iterdir()) == [] and not out.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid in ranks:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
