"""A plan in a folder whose name holds a line break (or another control character): the torchrun
and SLURM scripts quote every path export derived from it (the plan, the files it names, its
folder, the default checkpoint folder) and check the plan's SHA-256 there, so the job runs; the
check said 'missing or changed' of every such plan, and the SLURM export blamed
--checkpoint-dir, a flag not given."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan import resources
from autoplan.commands import main
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.plan_files import save_plan
from autoplan.yaml_io import dump_yaml, read_yaml, to_dict

SCRIPTS = {"torchrun": "launch.sh", "slurm": "job.sbatch"}
FOLDERS = ["runs\nnext", "runs\ttab", "runs\x7fdel"]
RANK = """import json, os, sys
from autoplan.hardware import load_profile
from autoplan.plan_files import load_plan
argv = sys.argv[1:]
plan = load_plan(argv[argv.index('train') + 1])
plan.model_spec()
load_profile(plan.cluster.profile)
with open(os.environ['CALLS'], 'w') as fh:
    json.dump({'argv': argv, 'cwd': os.getcwd()}, fh)
"""


def _plan_beside_its_files(folder: Path) -> Path:
    """A CPU plan naming its model and profile by paths relative to its folder."""
    folder.mkdir(parents=True)
    (folder / "model.yaml").write_text(dump_yaml(to_dict(PRESETS["tiny"].replace(name="mine"))))
    cpu = resources.find(resources.PROFILES, "cpu-gloo")
    assert cpu is not None
    (folder / "site.yaml").write_text(dump_yaml(read_yaml(cpu, "profile")))
    plan = Plan(model="model.yaml", cluster=ClusterRef("site.yaml", 4), parallel=Parallel(dp=4),
                batch=Batch(micro_batch_size=2, global_batch_size=8))
    return save_plan(plan, folder / "plan.yaml")


def _run(script: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    """The script under bash from another folder, torchrun (and srun) replaced by a rank's
    first reads, which records its argv and working directory as JSON (a line break inside
    an argument survives)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "rank.py").write_text(RANK)
    for name in ("torchrun", "srun"):
        (bin_dir / name).write_text(f"#!/bin/bash\nexec {shlex.quote(sys.executable)} "
                                    f"{shlex.quote(str(bin_dir / 'rank.py'))} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node1\n")
    (bin_dir / "scontrol").chmod(0o755)
    calls = tmp_path / "calls.json"
    calls.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=elsewhere)
    return done, (json.loads(calls.read_text()) if calls.exists() else None)


@pytest.mark.parametrize("target", list(SCRIPTS))
@pytest.mark.parametrize("name", FOLDERS)
def test_a_plan_in_a_folder_named_with_a_control_character_trains(tmp_path, monkeypatch,
                                                                   target, name):
    folder = tmp_path / name
    plan = _plan_beside_its_files(folder)
    monkeypatch.chdir(folder)  # the default checkpoint folder lies in it too
    script = tmp_path / SCRIPTS[target]
    assert main(["export", "plan.yaml", "--to", target, "--out", str(script)]) == 0
    done, call = _run(script, tmp_path)
    assert done.returncode == 0 and call is not None, done.stderr
    train = call["argv"][call["argv"].index("train"):]
    assert train[1] == str(plan)
    assert train[train.index("--checkpoint-dir") + 1] == str(folder / "checkpoints")
    # the plan's relative paths are read from its folder (load_plan): the job need not cd
    assert call["cwd"] == str(tmp_path / "elsewhere")


@pytest.mark.parametrize("target", list(SCRIPTS))
@pytest.mark.parametrize("edited", ["plan.yaml", "model.yaml"])
def test_a_file_changed_in_such_a_folder_still_stops_the_job_in_one_line(tmp_path, monkeypatch,
                                                                         target, edited):
    folder = tmp_path / "runs\nnext"
    _plan_beside_its_files(folder)
    monkeypatch.chdir(folder)
    script = tmp_path / SCRIPTS[target]
    assert main(["export", "plan.yaml", "--to", target, "--out", str(script)]) == 0
    with open(folder / edited, "a") as fh:
        fh.write("# edited\n")
    done, call = _run(script, tmp_path)
    assert done.returncode == 2 and call is None
    what = f"{str(folder / edited)!r}" + (" (model of the plan)" if edited == "model.yaml" else "")
    assert done.stderr == (f"{what} is missing or changed since autoplan export priced it; "
                           "export the plan again\n")


def test_sbatch_refuses_a_carriage_return_before_a_line_break_so_export_does(tmp_path, capsys,
                                                                            monkeypatch):
    """sbatch refuses a script holding "\\r\\n" (DOS line breaks), quoted or not: refused at
    export in one line, naming the path; torchrun's script runs it."""
    from tests.cli_refusals import assert_refused

    folder = tmp_path / "runs\r\nnext"
    plan = _plan_beside_its_files(folder)
    monkeypatch.chdir(folder)
    out = tmp_path / "job.sbatch"
    assert_refused(capsys, ["export", "plan.yaml", "--to", "slurm", "--checkpoint-dir",
                            str(tmp_path / "ck"), "--out", str(out)],
                   f"PLAN: {str(plan)!r} holds a carriage return and a line break, which "
                   "sbatch refuses", "rename the folder or file, or export --to torchrun")
    assert not out.exists()
    script = tmp_path / "launch.sh"
    assert main(["export", "plan.yaml", "--to", "torchrun", "--checkpoint-dir",
                 str(tmp_path / "ck"), "--out", str(script)]) == 0
    done, call = _run(script, tmp_path)
    assert done.returncode == 0 and call is not None, done.stderr
