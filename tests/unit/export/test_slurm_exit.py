"""How the SLURM job ends after its srun step: a clean stop on the time-limit warning (rank 0
named the step every rank saved in SAVED_STEP_ENV's file) exits 0 with one line on how to
resume, where torchrun's exit 1 after a SIGTERM would have SLURM record it as FAILED; a crash
keeps srun's status. The generated script runs under bash with srun stubbed (the stub plays
the step's outcome); a real torchrun stopped by SIGTERM is tests/dist/test_slurm_stop.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from autoplan.export.base import export_plan
from autoplan.export.launch import LaunchOptions, stop_lead
from autoplan.export.registry import get_target
from autoplan.export.slurm import SIGNAL_MAX_S
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV

from .cases import CASES
from .consumers import bash_syntax_ok

STEPS = 1000
SRUN = """#!/bin/bash
# the step as a test plays it: rank 0 names $FAKE_SAVED (if set), then srun exits $FAKE_STATUS
printf '%s' "${AUTOPLAN_SAVED_STEP_FILE-unset}" > "$SEEN"
if [ -n "${FAKE_SAVED+x}" ]; then printf '%s\\n' "$FAKE_SAVED" > "$AUTOPLAN_SAVED_STEP_FILE"; fi
exit "$FAKE_STATUS"
"""


def _script(tmp_path: Path, ckpt: Path, **kw) -> tuple[Path, int]:
    """The sbatch script of dp-zero1 (2 nodes of 8 GPUs) and its --signal seconds."""
    plan = CASES["dp-zero1"][0]
    opts = LaunchOptions(gpus_per_node=8, checkpoint_dir=str(ckpt), steps=STEPS, **kw)
    [text] = export_plan(get_target("slurm"), plan, plan.model_spec(), opts).values()
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bash_syntax_ok(script)
    return script, min(SIGNAL_MAX_S, stop_lead(plan, plan.model_spec(), 8).seconds_s)


def _run(script: Path, *, status: int, saved: str | None = None, scontrol: str | None = None,
         **env: str) -> subprocess.CompletedProcess:
    """The script under bash with srun stubbed (and scontrol: `show hostnames` answers node1
    unless `scontrol` is another stub)."""
    bin_dir = script.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "scontrol").write_text(scontrol or "#!/bin/bash\necho node1\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "AUTOPLAN_"))}
    base |= {"PATH": f"{bin_dir}:{base['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]",
             "SLURM_JOB_ID": "42", "SEEN": str(script.parent / "seen"),
             "FAKE_STATUS": str(status), **env}
    if saved is not None:
        base["FAKE_SAVED"] = saved
    return subprocess.run(["bash", str(script)], env=base, text=True, capture_output=True,
                          timeout=30, cwd=script.parent)


def test_a_clean_stop_at_the_warning_exits_0_and_says_how_to_resume(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    script, signal_s = _script(tmp_path, ckpt)
    res = _run(script, status=1, saved="335")  # torchrun's exit after passing SIGTERM on
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"autoplan: the ranks stopped on SIGTERM after step 335 of {STEPS} and saved checkpoint "
        f"step-00000335 in {ckpt} (the time-limit warning that --signal sets, or a scancel"
        " --signal=TERM): submitting this script again resumes from it\n")
    # the warning's time is the script's #SBATCH line alone: sbatch --signal may replace it
    assert f"TERM@{signal_s}" not in script.read_text().split("\nstatus=0\n")[1]
    assert list(ckpt.iterdir()) == []  # the step's file is read and removed


def test_a_crash_keeps_sruns_status_and_says_nothing(tmp_path: Path):
    script, _ = _script(tmp_path, tmp_path / "ckpt")
    for status in (1, 137):
        res = _run(script, status=status)
        assert res.returncode == status
        assert "autoplan:" not in res.stdout + res.stderr


@pytest.mark.parametrize("saved", ["", "33x", "-1", "12 34"])
def test_a_step_file_that_names_no_step_is_no_clean_stop(tmp_path: Path, saved: str):
    script, _ = _script(tmp_path, tmp_path / "ckpt")
    res = _run(script, status=1, saved=saved)
    assert res.returncode == 1 and "autoplan:" not in res.stdout


def test_a_sigterm_in_the_last_step_is_a_finished_run(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    script, _ = _script(tmp_path, ckpt)
    res = _run(script, status=1, saved=str(STEPS))
    assert res.returncode == 0
    assert res.stdout == (f"autoplan: trained all {STEPS} steps and saved checkpoint "
                          f"step-00001000 in {ckpt}; srun's status was 1 (torchrun exits 1 "
                          "after passing on a SIGTERM)\n")
    done = _run(script, status=0, saved=str(STEPS))  # no signal: nothing to add
    assert (done.returncode, done.stdout) == (0, "")


def test_an_elastic_job_whose_lost_node_failed_srun_names_both_causes(tmp_path: Path):
    """Under --elastic a node lost after the others finished sets srun's status too: the line
    names the status without claiming a SIGTERM it cannot know about."""
    ckpt = tmp_path / "ckpt"
    script, _ = _script(tmp_path, ckpt, elastic=True, min_nodes=1)
    res = _run(script, status=9, saved=str(STEPS))
    assert res.returncode == 0
    assert res.stdout == (f"autoplan: trained all {STEPS} steps and saved checkpoint "
                          f"step-00001000 in {ckpt}; srun's status was 9 (torchrun exits 1 "
                          "after passing on a SIGTERM; under --elastic a lost node also sets "
                          "it)\n")


def test_the_step_file_is_this_run_of_this_job_in_the_checkpoint_folder(tmp_path: Path):
    """Rank 0 may run on any node: the file lies in the checkpoint folder, which all read. Its
    name is this job's and this run's (a requeue counts in SLURM_RESTART_COUNT), so a file an
    earlier job left there is not taken for this one's stop."""
    ckpt = tmp_path / "ckpt"
    script, _ = _script(tmp_path, ckpt)
    ckpt.mkdir()
    stale = ckpt / "autoplan-saved-step-41.0"
    stale.write_text("335\n")
    res = _run(script, status=1)
    assert res.returncode == 1 and "autoplan:" not in res.stdout
    assert (tmp_path / "seen").read_text() == f"{ckpt}/autoplan-saved-step-42.0"
    assert stale.read_text() == "335\n"
    _run(script, status=0, SLURM_RESTART_COUNT="2")
    assert (tmp_path / "seen").read_text() == f"{ckpt}/autoplan-saved-step-42.2"
    assert SAVED_STEP_ENV == "AUTOPLAN_SAVED_STEP_FILE"  # the name the stub reads


def test_an_odd_checkpoint_folder_and_the_written_script_are_named_as_they_are(
        tmp_path: Path, monkeypatch):
    """--out as typed is relative to where export ran: the line names it absolute, as the
    script names --checkpoint-dir and --data, so it holds wherever the job runs from."""
    ckpt = tmp_path / "run 1's %s ckpt"
    monkeypatch.chdir(tmp_path)
    script, _ = _script(tmp_path, ckpt, out="jobs/train $1.sbatch")
    ckpt.mkdir()
    res = _run(script, status=1, saved="7")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"autoplan: the ranks stopped on SIGTERM after step 7 of {STEPS} and saved checkpoint "
        f"step-00000007 in {ckpt} (the time-limit warning that --signal sets, or a scancel"
        f" --signal=TERM): sbatch '{tmp_path}/jobs/train $1.sbatch' resumes from it\n")
    done = _run(script, status=1, saved=str(STEPS))
    assert done.stdout.startswith(f"autoplan: trained all {STEPS} steps and saved checkpoint "
                                  f"step-00001000 in {ckpt}; ")


def test_the_header_says_what_the_exit_status_means():
    plan = CASES["dp-zero1"][0]
    [text] = export_plan(get_target("slurm"), plan, plan.model_spec(),
                         LaunchOptions(gpus_per_node=8, steps=STEPS)).values()
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "torchrun exits 1 once it has passed a SIGTERM on, whatever its ranks did" in header
    assert f"before all {STEPS} steps are trained" in header
    assert "A crash, or ranks killed before their save, keeps srun's status." in header
