"""The SLURM job's time-limit warning (#SBATCH --signal) and its word on shared checkpoints.

At the time limit SLURM allows only KillWait (30 s by default) between SIGTERM and SIGKILL;
autoplan's ranks need the rest of a step and a save. The export asks for SIGTERM one priced step
plus SAVE_MARGIN_S before the limit, and gives torchrun as long before it kills its ranks."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.launch import SAVE_MARGIN_S, SHUTDOWN_ENV, UNPRICED_STEP_S
from autoplan.export.nodes import written_cluster
from autoplan.export.registry import get_target
from autoplan.export.slurm import SIGNAL_MAX_S
from autoplan.plan import Batch, ClusterRef, Plan

from .cases import CASES
from .consumers import bash_syntax_ok
from .real_sbatch import ACCEPTED, needs_sbatch, sbatch_test_only

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "slurm" in ok]
SIGNAL = re.compile(r"^#SBATCH --signal=(\S+)$", re.M)


def _sbatch(plan: Plan, **kw) -> str:
    files = export_plan(get_target("slurm"), plan, plan.model_spec(),
                        ExportOptions(gpus_per_node=8, **kw))
    return files["autoplan.sbatch"]


def _seconds(text: str) -> int:
    [value] = SIGNAL.findall(text)
    sig, _, seconds = value.partition("@")
    assert sig == "TERM"  # no B: prefix: every job step (srun: torchrun, ranks), not the shell
    return int(seconds)


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_the_warning_is_one_priced_step_plus_the_save(case: str):
    plan = CASES[case][0]
    est = estimate_plan(plan, written_cluster(plan, 8), model=plan.model_spec())
    seconds = _seconds(_sbatch(plan))
    assert seconds == math.ceil(est.step_time_s * (1 + est.error_band)) + SAVE_MARGIN_S
    assert seconds > 30  # more than KillWait's default, which is what the directive is for


def test_a_slow_step_gets_a_longer_warning():
    """gpt3-175b on 64 GPUs, a batch of 1536: a step of minutes, so the warning is no
    constant."""
    fast = _seconds(_sbatch(CASES["dp-zero1"][0]))
    slow_plan = CASES["megatron-3d"][0]
    slow_plan = slow_plan.replace(model="gpt3-175b", batch=Batch(1, 1536))
    est = estimate_plan(slow_plan, written_cluster(slow_plan, 8), model=slow_plan.model_spec())
    assert est.step_time_s > 30  # longer than KillWait alone would allow
    slow = _seconds(_sbatch(slow_plan))
    assert slow > fast and slow >= est.step_time_s + SAVE_MARGIN_S


def _elsewhere(**predicted: float) -> Plan:
    """dp-zero1 on a profile this machine cannot load (another site's)."""
    plan = CASES["dp-zero1"][0]
    return plan.replace(cluster=ClusterRef("/nonexistent/site-profile.yaml", 16),
                        predicted=predicted or None)


@pytest.mark.parametrize("predicted, expected, words", [
    ({"step_time_s": 45.8, "error_band": 0.1}, math.ceil(45.8 * 1.1) + SAVE_MARGIN_S,
     "as the plan's search predicted"),
    ({}, UNPRICED_STEP_S + SAVE_MARGIN_S, "a guessed"),
    ({"step_time_s": 1e6, "error_band": 0.0}, SIGNAL_MAX_S, "capped at sbatch's"),
])
def test_a_plan_priced_elsewhere_uses_its_prediction_or_says_it_guesses(predicted, expected,
                                                                       words):
    text = _sbatch(_elsewhere(**predicted))
    assert _seconds(text) == expected
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert words in header and f"--signal=TERM@{expected}" in header


def test_torchrun_waits_as_long_as_the_warning(tmp_path: Path):
    """The script exports SHUTDOWN_ENV (unless already set) to srun's torchrun, and torchrun
    reads it as its shutdown timeout (the SIGTERM-to-SIGKILL wait for its ranks, 30 s by
    default)."""
    text = _sbatch(CASES["dp-zero1"][0], checkpoint_dir=str(tmp_path / "ckpt"))
    seconds = _seconds(text)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bash_syntax_ok(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen"
    (bin_dir / "srun").write_text(f'#!/bin/bash\nprintf "%s" "${SHUTDOWN_ENV}" > {seen}\n')
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node1\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != SHUTDOWN_ENV}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_JOB_ID": "42"}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30, cwd=tmp_path)
    assert seen.read_text() == str(seconds)
    subprocess.run(["bash", str(script)], env=env | {SHUTDOWN_ENV: "900"}, check=True,
                   timeout=30, cwd=tmp_path)
    assert seen.read_text() == "900"  # `S=900 sbatch --signal=TERM@900` as the header says

    api = pytest.importorskip("torch.distributed.launcher.api")
    if "shutdown_timeout" not in api.LaunchConfig.__dataclass_fields__:
        pytest.skip("this torch's torchrun has no shutdown timeout (before --shutdown-timeout)")
    os.environ[SHUTDOWN_ENV] = str(seconds)
    try:
        config = api.LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=8)
    finally:
        del os.environ[SHUTDOWN_ENV]
    assert config.shutdown_timeout == seconds


@needs_sbatch
def test_real_sbatch_takes_the_capped_warning_and_refuses_one_past_it(tmp_path: Path):
    text = _sbatch(_elsewhere(step_time_s=1e6))
    assert ACCEPTED in sbatch_test_only(tmp_path, text)  # parsed, then no controller
    past = text.replace(f"TERM@{SIGNAL_MAX_S}", f"TERM@{SIGNAL_MAX_S + 1}")
    assert "Invalid --signal specification" in sbatch_test_only(tmp_path, past)


@pytest.mark.parametrize("target", ["slurm", "torchrun"])
def test_the_checkpoint_folder_is_said_to_be_shared_on_several_nodes(target: str):
    plan = CASES["dp-zero1"][0]  # 16 GPUs: 2 nodes of 8
    files = export_plan(get_target(target), plan, plan.model_spec(),
                        ExportOptions(gpus_per_node=8, checkpoint_dir="/shared/run1/ckpt"))
    header = " ".join(line[2:] for line in next(iter(files.values())).splitlines()
                      if line.startswith("# "))
    assert "checkpoints: /shared/run1/ckpt (absolute" in header
    assert "storage all 2 nodes read and write (a shared filesystem)" in header
    one = export_plan(get_target(target), plan, plan.model_spec(),
                      ExportOptions(gpus_per_node=16, checkpoint_dir="/local/ckpt"))
    assert "shared filesystem" not in next(iter(one.values()))


def test_a_line_break_in_the_checkpoint_folder_stays_inside_the_comment(tmp_path: Path):
    """The folder is written into the header's comment escaped: a raw line break there would
    end the comment and run the rest of the path as a command."""
    folder = str(tmp_path / "runs\nrm -rf x" / "ckpt")
    text = _sbatch(CASES["dp-zero1"][0], checkpoint_dir=folder)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bash_syntax_ok(script)
    header = text.split("\nset -euo pipefail\n")[0].splitlines()
    assert all(line.startswith("#") for line in header), header
    assert repr(folder) in " ".join(line[2:] for line in header)


def _header(text: str) -> str:
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


def test_the_mkdir_is_said_to_run_on_the_first_node_only_where_there_are_several():
    """One node: the only node is the first, so the remark said nothing."""
    plan = CASES["dp-zero1"][0]  # 16 GPUs
    two = _header(_sbatch(plan, checkpoint_dir="/shared/ckpt"))
    assert "(absolute, as export resolved it; the mkdir below runs on the first node only)" \
        in two
    one = _header(export_plan(get_target("slurm"), plan, plan.model_spec(),
                              ExportOptions(gpus_per_node=16, checkpoint_dir="/local/ckpt")
                              )["autoplan.sbatch"])
    assert "checkpoints: /local/ckpt (absolute, as export resolved it), read back" in one
    assert "mkdir" not in one


@pytest.mark.parametrize("target", ["slurm", "torchrun"])
def test_a_relative_checkpoint_folder_is_not_said_to_be_absolute_or_anything_else(target: str):
    """The CLI makes the folder absolute; a caller of export_plan may not: the comment names it
    as given, claiming nothing of how it resolves."""
    plan = CASES["dp-zero1"][0]
    [text] = export_plan(get_target(target), plan, plan.model_spec(),
                         ExportOptions(gpus_per_node=8, checkpoint_dir="ckpt")).values()
    header = _header(text)
    assert "checkpoints: ckpt" in header
    assert "absolute" not in header and "relative to" not in header


def test_the_header_says_an_older_torchrun_ignores_the_shutdown_timeout():
    """pytorch#172596 added --shutdown-timeout and its environment form; the package allows
    torch>=2.6, whose torchrun ignores the variable and SIGKILLs its ranks 30 s after SIGTERM."""
    header = _header(_sbatch(CASES["dp-zero1"][0]))
    assert ("only a torchrun that has --shutdown-timeout reads it (pytorch/pytorch#172596, "
            "2026; see `torchrun --help`): an older torchrun ignores it and SIGKILLs the ranks "
            "30 s after passing SIGTERM on") in header
