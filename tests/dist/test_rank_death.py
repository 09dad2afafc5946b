"""One rank of a 2-rank gloo job dies (SIGKILL) or raises: the other rank's failed collective
prints no traceback, one line names the rank that died, and a real error keeps its traceback
(rank_failures.py). The restart after a kill -9 is tests/dist/test_interrupts.py's kill9 case."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from autoplan.plan_files import save_plan
from autoplan.runtime.launch import torchrun_command
from autoplan.runtime.rank_failures import read_failure
from tests.dist.interrupt import _rank_pid, metrics_steps, train_cmd
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

RANK_SCRIPT = """
import os, signal, sys
from datetime import timedelta
import torch, torch.distributed as dist
from autoplan.runtime import worker

def run(args):  # the worker's main and run_and_report around a loop of collectives
    signal.signal(signal.SIGTERM, lambda *_: None)  # as worker._StopFlag: finish the step
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    t = torch.ones(4)
    for i in range(100000):
        if dist.get_rank() == 1 and i == 20:
            if sys.argv[1] == "bug":
                raise ValueError("planted bug in rank 1")
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
    return None

worker.run = run
code = worker.main(sys.argv[2:])
sys.stderr.flush()
os._exit(code)
"""


def _torchrun(tmp_path: Path, mode: str, *, quiet: bool) -> subprocess.CompletedProcess:
    """2 ranks of RANK_SCRIPT under torchrun: as `autoplan train` runs it (quiet_torchrun,
    --summary-file in its folder) or as another launcher does (plain torchrun)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    folder = tmp_path / "launcher"
    folder.mkdir()
    argv = ["plan.yaml"] + (["--summary-file", str(folder / "summary.json")] if quiet else [])
    cmd = torchrun_command(2, 0, [], errors=str(folder) if quiet else None)
    cmd = cmd[:cmd.index("-m", 3)] + [str(script), mode, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_rank_killed_under_autoplan_train_leaves_the_others_silent(tmp_path):
    proc = _torchrun(tmp_path, "kill", quiet=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-3000:]  # the launcher says it (below)
    folder = str(tmp_path / "launcher")
    assert (Path(folder) / "peer_lost.attempt0.rank0").is_file()
    failure = read_failure(folder)
    assert failure is not None and failure.died == {1: -signal.SIGKILL}, failure
    assert failure.describe() == "rank 1 was killed by SIGKILL"


def test_a_rank_that_raises_keeps_its_traceback_and_torchruns_report(tmp_path):
    proc = _torchrun(tmp_path, "bug", quiet=True)
    assert proc.returncode != 0
    assert "ValueError: planted bug in rank 1" in proc.stderr, proc.stderr[-3000:]
    assert "ChildFailedError" in proc.stderr, proc.stderr[-3000:]
    assert "[rank0]" not in proc.stderr and "Connection" not in proc.stderr, proc.stderr[-3000:]
    failure = read_failure(str(tmp_path / "launcher"))
    assert failure is not None and failure.died == {1: 1}, failure
    assert failure.describe() == "rank 1 exited with code 1 (its error is above)"


def test_under_another_launcher_the_surviving_rank_says_one_line(tmp_path):
    """torchrun --max-restarts 0: the line says no restart follows (it promised one)."""
    proc = _torchrun(tmp_path, "kill", quiet=False)
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("[rank0]")]
    assert len(ours) == 1, proc.stderr[-3000:]  # its traceback would be "[rank0]: ..." lines
    assert re.fullmatch(r"\[rank0\] autoplan: a collective failed \(Connection (closed|reset) "
                        r"by peer\): another rank is gone; exiting 1; no restart is left "
                        r"\(--max-restarts 0\), so the job ends", ours[0]), ours


def test_a_rank_killed_with_no_restart_left_is_one_error_line(tmp_path):
    """--max-restarts 0: the launcher's one error names the rank, the signal and what --resume
    continues from; nothing else but the steps and rank 0's checkpoint lines."""
    plan = str(save_plan(make_plan(dp=2, zero=2), tmp_path / "plan.yaml"))
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    proc = subprocess.Popen(train_cmd(plan, 40, ck, metrics, "--checkpoint-every", "3"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    killed = False
    deadline = time.monotonic() + 180
    while proc.poll() is None and not killed and time.monotonic() < deadline:
        pid = _rank_pid(str(ck), 0) if len(metrics_steps(metrics)) >= 4 else None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.01)
    _, err = proc.communicate(timeout=180)
    assert killed and proc.returncode == 1, err[-3000:]
    said = [ln for ln in err.splitlines()
            if not ln.startswith("step ") and not ln.startswith("[rank0] INFO ")]
    assert len(said) == 1, err[-3000:]
    found = re.fullmatch(r"autoplan train: error: rank 0 was killed by SIGKILL, and no restart "
                         r"is left \(--max-restarts 0\); --resume continues from "
                         r"step-(\d{8}) \(step (\d+)\)", said[0])
    assert found and int(found[1]) == int(found[2]) >= 3, said
