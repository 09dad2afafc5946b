"""The DeepSpeed launch on several nodes reads its hostfile beside the script, as it reads its
config, wherever it is run from; without one it stops, where DeepSpeed's launcher would warn
and train on the local node alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan_files import save_plan

from .cases import CASES
from .consumers import run_script


def _export(tmp_path: Path, case: str) -> Path:
    plan = save_plan(CASES[case][0], tmp_path / "plan.yaml")
    out = tmp_path / "jobs" / "ds.json"
    assert main(["export", str(plan), "--to", "deepspeed", "--out", str(out),
                 "--no-memory-check"]) == 0  # the launch is the subject, not the fit
    return out.with_name("ds.launch.sh")


@pytest.mark.parametrize("case", ["dp-zero1", "gpt3-175b-3d-sp"])  # plain ZeRO, and 3D
def test_the_hostfile_beside_the_launch_is_the_one_deepspeed_reads(tmp_path: Path, case: str):
    launch = _export(tmp_path, case)
    elsewhere = tmp_path / "Megatron-DeepSpeed"
    elsewhere.mkdir()
    (elsewhere / "hostfile").write_text("wrong slots=8\n")  # the working folder's: not read
    (launch.parent / "hostfile").write_text("node1 slots=8\nnode2 slots=8\n")
    [call] = run_script(launch, {"deepspeed": ""}, cwd=elsewhere)
    runner = pytest.importorskip("deepspeed.launcher.runner")
    args = runner.parse_args(call[1:])
    assert Path(args.hostfile).resolve() == (launch.parent / "hostfile").resolve()
    assert runner.fetch_hostfile(args.hostfile) == {"node1": 8, "node2": 8}
    world = CASES[case][0].world_size
    assert (args.num_nodes, args.num_gpus) == (world // 8, 8)  # a line per node it runs on


def test_a_missing_hostfile_stops_the_launch_in_one_line(tmp_path: Path):
    launch = _export(tmp_path, "dp-zero1")
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "deepspeed").write_text(f"#!/bin/bash\ntouch {calls}\n")
    (bin_dir / "deepspeed").chmod(0o755)
    done = subprocess.run(["bash", str(launch)], capture_output=True, text=True, timeout=30,
                          cwd=tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert done.returncode == 2 and not calls.exists()
    assert done.stderr.count("\n") == 1
    assert f"no hostfile beside this launch: write one line per node ('<host> slots=8') to " \
           f"{launch.parent / 'hostfile'}" in done.stderr
    assert "reads them from hostfile in this script's folder" in launch.read_text()


def test_one_node_needs_no_hostfile(tmp_path: Path):
    launch = _export(tmp_path, "single-node-tp")
    text = launch.read_text()
    assert "hostfile" not in text
    [call] = run_script(launch, {"deepspeed": ""}, cwd=tmp_path)
    assert not any(w.startswith("--hostfile") for w in call)
