"""torchrun and SLURM exports, run under bash with the launchers stubbed and read by torchrun's
own parser; SLURM options are checked by the real sbatch (Debian's slurm-client) when present."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target

from .cases import CASES
from .consumers import bash_syntax_ok, run_script, torchrun_args

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "slurm" in ok]
# sbatch long options autoplan writes, as documented in sbatch(1) (slurm.schedmd.com/sbatch.html).
SBATCH_DOCUMENTED = {"job-name", "nodes", "ntasks-per-node", "gpus-per-node", "exclusive", "output"}


def _write(tmp_path: Path, target: str, case: str, **kw) -> tuple[Path, object]:
    plan = CASES[case][0]
    files = export_plan(
        get_target(target), plan, plan.model_spec(), ExportOptions(gpus_per_node=8, **kw)
    )
    name, text = next(iter(files.items()))
    path = tmp_path / name
    path.write_text(text)
    return path, plan


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_torchrun_script_runs_autoplan_train_on_every_gpu(tmp_path: Path, case: str):
    path, plan = _write(tmp_path, "torchrun", case, plan_path="plan.yaml")
    bash_syntax_ok(path)
    [call] = run_script(path, {"torchrun": ""})
    args = torchrun_args(call[1:])
    nodes = int(args.nnodes)
    assert nodes * int(args.nproc_per_node) == plan.world_size
    assert args.standalone == (nodes == 1)
    assert args.no_python and args.max_restarts == 3
    assert [args.training_script, *args.training_script_args] == [
        "autoplan",
        "train",
        "plan.yaml",
        "--checkpoint-dir",
        "checkpoints",
        "--resume",
    ]


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_slurm_script_runs_one_torchrun_per_node(tmp_path: Path, case: str):
    path, plan = _write(tmp_path, "slurm", case, checkpoint_dir=str(tmp_path / "ckpt"))
    bash_syntax_ok(path)
    options = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", path.read_text(), re.M))
    assert set(options) <= SBATCH_DOCUMENTED
    nodes, gpus = int(options["nodes"]), int(options["gpus-per-node"])
    assert nodes * gpus == plan.world_size and options["ntasks-per-node"] == "1"
    calls = run_script(path, {"scontrol": "node1", "srun": ""})
    srun = [c for c in calls if c[0] == "srun"]
    assert len(srun) == 1 and srun[0][1] == "torchrun"
    args = torchrun_args(srun[0][2:])
    assert (int(args.nnodes), int(args.nproc_per_node)) == (nodes, gpus)
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "node1:29500"
    assert args.rdzv_id == "42" and args.max_restarts == 3
    assert (tmp_path / "ckpt").is_dir()


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch (slurm-client) not installed")
@pytest.mark.parametrize("case", EXPRESSIBLE[:3])
def test_real_sbatch_accepts_every_option(tmp_path: Path, case: str):
    path, _ = _write(tmp_path, "slurm", case)
    conf = tmp_path / "slurm.conf"  # enough config for sbatch to parse; no controller runs
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=1\nMessageTimeout=1\n"
        "GresTypes=gpu\nNodeName=n[1-64] CPUs=64 Gres=gpu:8\n"
        "PartitionName=p Nodes=ALL Default=YES\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    done = subprocess.run(
        ["sbatch", "--test-only", str(path)], env=env, capture_output=True, text=True, timeout=60
    )
    # sbatch parses every #SBATCH option before it contacts the (absent) controller.
    assert "unrecognized option" not in done.stderr and "invalid" not in done.stderr.lower()
    assert "Unable to contact slurm controller" in done.stderr, done.stderr


def test_bogus_sbatch_option_is_caught_by_sbatch(tmp_path: Path):
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch (slurm-client) not installed")
    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\n#SBATCH --gpus-per-nodes=8\ntrue\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\n")
    done = subprocess.run(
        ["sbatch", "--test-only", str(bad)],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(conf)},
        timeout=60,
    )
    assert "unrecognized option" in done.stderr
