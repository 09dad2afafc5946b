"""An --elastic job started again once its run is done (requeued or resubmitted with --resume,
as the slurm and kubernetes exports always pass it), for real: two single-process torchrun
agents (`--nnodes=1:2`, c10d rendezvous, the store hosted here as in test_elastic.py) train a
dp=2 plan to --steps, then run again: rank 0 says the non-elastic path's one line, every rank
and agent exits 0, and nothing is written (it used to print an empty summary and write the
saved-step file)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.plan_files import save_plan
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV
from autoplan.runtime.launch import ELASTIC_ENV
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]
STEPS, NODES = 2, 2
JOB_TIMEOUT_S = 120
LAST_CALL_S = 6
"""As test_elastic.py: the agents started together make one round of two."""


def _job(port: int, plan: str, work: Path, rdzv_id: str) -> list[subprocess.CompletedProcess]:
    """Both agents of the job, run to their end: (returncode, stdout, stderr) each."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes=1:{NODES}",
           "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           f"--rdzv-id={rdzv_id}",
           f"--rdzv-conf=is_host=false,last_call_timeout={LAST_CALL_S},join_timeout=60",
           "--max-restarts=0", "--monitor-interval=0.5",
           "-m", "autoplan.runtime.worker", plan, "--elastic", "--resume",
           "--space", "small-cpu", "--steps", str(STEPS), "--checkpoint-dir", str(work / "ck"),
           "--metrics-file", str(work / "m.jsonl"), "--pg-timeout-s", "60", "--format", "json"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPLAN_")}
    env.update(OMP_NUM_THREADS="1", **ELASTIC_ENV)
    env[SAVED_STEP_ENV] = str(work / "saved-step")  # as the exported job scripts set it
    agents = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               text=True, cwd=work) for _ in range(NODES)]
    out = []
    try:
        for a in agents:
            stdout, stderr = a.communicate(timeout=JOB_TIMEOUT_S)
            out.append(subprocess.CompletedProcess(cmd, a.returncode, stdout, stderr))
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    return out


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_an_elastic_job_run_again_on_a_finished_run_says_so_and_writes_nothing(tmp_path):
    import torch.distributed as dist

    plan = str(save_plan(make_plan(dp=NODES), tmp_path / "plan.yaml"))
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    first = _job(store.port, plan, tmp_path, "first")
    logs = "\n".join(r.stderr for r in first)[-4000:]
    assert [r.returncode for r in first] == [0, 0], logs
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == [f"step-{STEPS:08d}"]
    assert (tmp_path / "saved-step").read_text() == f"{STEPS}\n"  # the first run's end
    (tmp_path / "saved-step").unlink()  # the job script's, read and removed at its end
    before = _tree(tmp_path)

    again = _job(store.port, plan, tmp_path, "again")
    logs = "\n".join(r.stderr for r in again)[-4000:]
    assert [r.returncode for r in again] == [0, 0], logs
    done = (f"trained all {STEPS} steps already (checkpoint step {STEPS} in "
            f"{tmp_path / 'ck'}): nothing to do")
    said = [ln for r in again for ln in r.stderr.splitlines() if "nothing to" in ln]
    assert said == [f"autoplan train: {done}"], logs  # rank 0 only
    assert [r.stdout for r in again] == ["", ""], logs  # no summary, empty or not
    assert "error" not in logs.lower(), logs
    assert _tree(tmp_path) == before  # no checkpoint, metrics, saved step or re-plan written
