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
SBATCH_DOCUMENTED = {"job-name", "nodes", "ntasks-per-node", "gpus-per-node", "exclusive", "signal",
                     "output", "time"}


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
        "--steps",
        "20",
        "--checkpoint-dir",
        "checkpoints",
        "--checkpoint-every",
        "100",
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


def _train_flags(argv: list[str]):
    """`autoplan train`'s own parser on the launched words after `autoplan train`."""
    import argparse

    from autoplan.runtime.cli import add_train_arguments

    assert argv[:2] == ["autoplan", "train"]
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(argv[2:])


def test_slurm_elastic_form_runs_torchrun_min_max_and_train_elastic(tmp_path: Path):
    """#15 item 4: --nnodes=MIN:MAX with c10d, a job SLURM keeps when a node fails, srun that
    does not end the other nodes, and `autoplan train --elastic` with the matching GPU floor."""
    from torch.distributed.run import parse_min_max_nnodes

    path, plan = _write(tmp_path, "slurm", "megatron-3d", elastic=True, min_nodes=3,
                        checkpoint_dir=str(tmp_path / "ckpt"))
    bash_syntax_ok(path)
    text = path.read_text()
    assert re.search(r"^#SBATCH --no-kill$", text, re.M)
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
    calls = run_script(path, {"scontrol": "node1", "srun": ""})
    [srun] = [c for c in calls if c[0] == "srun"]
    assert srun[1:3] == ["--kill-on-bad-exit=0", "torchrun"]
    args = torchrun_args(srun[3:])
    assert parse_min_max_nnodes(args.nnodes) == (3, plan.world_size // 8)
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "node1:29500"
    train = _train_flags([args.training_script, *args.training_script_args])
    assert train.elastic and train.resume and train.min_gpus == 3 * 8
    assert train.checkpoint_every > 0 and train.checkpoint_dir == str(tmp_path / "ckpt")


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch (slurm-client) not installed")
def test_real_sbatch_accepts_the_elastic_options(tmp_path: Path):
    path, _ = _write(tmp_path, "slurm", "megatron-3d", elastic=True, min_nodes=2)
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=1\nMessageTimeout=1\n"
        "GresTypes=gpu\nNodeName=n[1-64] CPUs=64 Gres=gpu:8\n"
        "PartitionName=p Nodes=ALL Default=YES\n"
    )
    done = subprocess.run(["sbatch", "--test-only", str(path)], capture_output=True, text=True,
                          env={**os.environ, "SLURM_CONF": str(conf)}, timeout=60)
    assert "unrecognized option" not in done.stderr and "invalid" not in done.stderr.lower()
    assert "Unable to contact slurm controller" in done.stderr, done.stderr


@pytest.mark.parametrize(("kw", "match"), [
    ({"elastic": True, "min_nodes": 0}, "--min-nodes: got 0"),
    ({"elastic": True, "min_nodes": 9}, "--min-nodes: got 9"),
    ({"min_nodes": 2}, "--min-nodes: got 2 without --elastic; add --elastic"),
])
def test_slurm_elastic_bounds_are_checked(tmp_path: Path, kw: dict, match: str):
    with pytest.raises(Exception, match=match):
        _write(tmp_path, "slurm", "megatron-3d", **kw)


def test_elastic_is_refused_for_targets_torchrun_does_not_launch(tmp_path: Path, capsys):
    from autoplan.commands import main
    from autoplan.plan_files import save_plan

    plan = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    assert main(["export", str(plan), "--to", "deepspeed", "--elastic"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--elastic" in err and "slurm" in err, err
