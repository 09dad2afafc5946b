"""The torchrun and SLURM scripts train the plan file exported, as priced: by its absolute path
(the script runs from any folder) and only while its SHA-256 is the exported one (a plan file
replaced since, by `search --force` or an edit, stops the job with exit 2 before torchrun)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan_files import save_plan

from .cases import CASES
from .consumers import run_script

SCRIPTS = {"torchrun": "launch.sh", "slurm": "job.sbatch"}
STUBS = {"torchrun": "", "srun": "", "scontrol": "node1"}


def _export(tmp_path: Path, target: str, monkeypatch) -> tuple[Path, Path]:
    """Export from tmp_path with the plan named relatively, as a user types it."""
    (tmp_path / "runs").mkdir()
    plan = save_plan(CASES["dp-zero1"][0], tmp_path / "runs" / "plan.yaml")
    monkeypatch.chdir(tmp_path)
    script = tmp_path / SCRIPTS[target]
    assert main(["export", "runs/plan.yaml", "--to", target, "--out", str(script)]) == 0
    return plan, script


@pytest.mark.parametrize("target", list(SCRIPTS))
def test_the_script_trains_the_plan_by_its_absolute_path_from_any_folder(tmp_path, monkeypatch,
                                                                        target):
    plan, script = _export(tmp_path, target, monkeypatch)
    text = script.read_text()
    assert hashlib.sha256(plan.read_bytes()).hexdigest() in text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    calls = run_script(script, STUBS, cwd=elsewhere)
    launch = next(c for c in calls if c[0] in ("torchrun", "srun"))
    assert str(plan.resolve()) in launch and "runs/plan.yaml" not in launch


@pytest.mark.parametrize("target", list(SCRIPTS))
@pytest.mark.parametrize("change", ["edit", "remove"])
def test_a_plan_changed_since_export_stops_the_job_before_torchrun(tmp_path, monkeypatch,
                                                                   target, change):
    plan, script = _export(tmp_path, target, monkeypatch)
    if change == "edit":
        plan.write_text(plan.read_text().replace("zero_stage: 1", "zero_stage: 2"))
    else:
        plan.unlink()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in STUBS:  # a launcher that ran would leave a mark
        stub = bin_dir / name
        stub.write_text(f"#!/bin/bash\ntouch {tmp_path / 'launched'}\necho node1\n")
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7", "RDZV_HOST": "node1"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"{plan.resolve()} is missing or changed since autoplan "
                                   "export priced it; export the plan again")
    assert not (tmp_path / "launched").exists()
