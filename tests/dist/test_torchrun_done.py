"""`--to torchrun`'s launch.sh run again once its run is done (a resubmitted, requeued or
afterok-chained job), for real (two CPU ranks, gloo): the ranks find the checkpoint at --steps,
rank 0 says so in one line, and every rank and the script exit 0, with no restart spent and
nothing written; they used to refuse it (exit 2 per rank, then a restart or exit 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from autoplan.export.base import export_plan
from autoplan.export.launch import LaunchOptions
from autoplan.export.registry import get_target
from autoplan.plan_files import save_plan
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


@pytest.mark.skipif(shutil.which("torchrun") is None or shutil.which("autoplan") is None,
                    reason="torchrun and autoplan must be on PATH, as on the job's nodes")
def test_the_script_run_again_on_a_finished_run_exits_0_saying_so(tmp_path: Path):
    plan = make_plan(dp=2)
    plan_file = save_plan(plan, tmp_path / "plan.yaml")
    ckpt = tmp_path / "ckpt"
    opts = LaunchOptions(plan_path=str(plan_file), gpus_per_node=2, checkpoint_dir=str(ckpt),
                         steps=2, checkpoint_every=0, max_restarts=0)
    [text] = export_plan(get_target("torchrun"), plan, plan.model_spec(), opts).values()
    script = tmp_path / "launch.sh"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPLAN_")}
    env["OMP_NUM_THREADS"] = "1"

    def job() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                              cwd=tmp_path, timeout=240)

    first = job()
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002"]
    before = _tree(tmp_path)
    again = job()  # --max-restarts 0: a rank's refusal failed the job (exit 1)
    assert again.returncode == 0, again.stderr[-3000:]
    done = "trained all 2 steps already (checkpoint step 2 in " + str(ckpt) + "): nothing to do"
    said = [line for line in again.stderr.splitlines() if "nothing to" in line]
    assert said == [f"autoplan train: {done}"], again.stderr[-3000:]  # rank 0 only
    assert "error" not in again.stderr and again.stdout == "", again.stderr[-3000:]
    assert _tree(tmp_path) == before  # no checkpoint, step file or summary written
