"""A job started as a scheduler starts it (torchrun with --max-restarts running `autoplan train
--resume` in place) over a checkpoint past its --steps fails: the first attempt refuses it
(exit 2), and so does every restart, where the ranks once trained nothing and every attempt
after the first ended 0 (srun, and so SLURM, reported success)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.plan_files import save_plan
from tests.dist.interrupt import OUTER_TIMEOUT_S, _env
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def _job(plan: str, steps: int, ckpt: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "--max-restarts=1", "-m", "autoplan.commands", "train", plan, "--steps", str(steps),
           "--checkpoint-dir", str(ckpt), "--resume", "--format", "json"]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(),
                          timeout=OUTER_TIMEOUT_S)


def test_a_restart_refuses_a_checkpoint_past_steps_as_the_first_attempt_did(tmp_path: Path):
    plan = str(save_plan(make_plan(dp=1), tmp_path / "plan.yaml"))
    ckpt = tmp_path / "ck"
    first = _job(plan, 2, ckpt)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout)["final_step"] == 2
    again = _job(plan, 1, ckpt)
    refusal = ("--steps: checkpoint step 2 >= --steps 1: nothing to train; raise --steps "
               "above 2")
    assert again.returncode != 0, again.stdout[-3000:]
    assert again.stderr.count(refusal) == 2, again.stderr[-3000:]  # the attempt and its restart
    assert "final_step" not in again.stdout  # no summary of a run that trained nothing
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002"]
