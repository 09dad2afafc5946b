"""How `--to torchrun`'s launch.sh ends: torchrun exits 1 once it has passed a SIGTERM on,
whatever its ranks did, so a run stopped cleanly (rank 0 named the step every rank saved in
SAVED_STEP_ENV's file) exits 0 with one line on how to resume, where a crash keeps torchrun's
status; the shell lines are the SLURM script's (saved_step.end_lines). The script runs under
bash with torchrun stubbed (the stub plays the run's outcome)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.export.base import export_plan
from autoplan.export.launch import LaunchOptions
from autoplan.export.registry import get_target
from autoplan.export.torchrun import SAVED_STEP_WAIT_S
from autoplan.plan_files import save_plan

from .cases import CASES, plan
from .consumers import bash_syntax_ok

STEPS = 1000
ONE_NODE = plan(gpus=8)
"""gpt3-1.3b on one node of 8 H100s."""
TWO_NODES = CASES["dp-zero1"][0]
"""gpt3-1.3b on 2 nodes of 8 H100s."""
TORCHRUN = """#!/bin/bash
# the run as a test plays it: rank 0 names $FAKE_SAVED (if set; after FAKE_LATE seconds, as rank 0
# on another node may), then torchrun exits $FAKE_STATUS
printf '%s' "${AUTOPLAN_SAVED_STEP_FILE-unset}" > "$SEEN"
if [ -n "${FAKE_SAVED+x}" ]; then
  mkdir -p "$(dirname "$AUTOPLAN_SAVED_STEP_FILE")"  # the checkpointer makes the folder
  ( sleep "${FAKE_LATE:-0}"; printf '%s\\n' "$FAKE_SAVED" > "$AUTOPLAN_SAVED_STEP_FILE" ) &
  [ -n "${FAKE_LATE-}" ] || wait
fi
exit "$FAKE_STATUS"
"""


def _script(tmp_path: Path, ckpt: Path, plan_=ONE_NODE, **kw) -> Path:
    opts = LaunchOptions(gpus_per_node=8, checkpoint_dir=str(ckpt), steps=STEPS, **kw)
    [text] = export_plan(get_target("torchrun"), plan_, plan_.model_spec(), opts).values()
    script = tmp_path / "launch.sh"
    script.write_text(text)
    bash_syntax_ok(script)
    return script


def _env(script: Path, stub: str, **env: str) -> dict[str, str]:
    bin_dir = script.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(stub)
    (bin_dir / "torchrun").chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPLAN_")}
    return base | {"PATH": f"{bin_dir}:{base['PATH']}", "SEEN": str(script.parent / "seen"),
                   "RDZV_HOST": "node1", **env}


def _run(script: Path, *, status: int, saved: str | None = None,
         **env: str) -> subprocess.CompletedProcess:
    """The script under bash with torchrun stubbed."""
    full = _env(script, TORCHRUN, FAKE_STATUS=str(status), **env)
    if saved is not None:
        full["FAKE_SAVED"] = saved
    return subprocess.run(["bash", str(script)], env=full, text=True, capture_output=True,
                          timeout=60, cwd=script.parent)


def test_a_clean_stop_short_of_the_steps_exits_0_and_says_how_to_resume(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    script = _script(tmp_path, ckpt)
    res = _run(script, status=1, saved="335")  # torchrun's exit after passing SIGTERM on
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"autoplan: the ranks stopped on a signal after step 335 of {STEPS} and saved "
        f"checkpoint step-00000335 in {ckpt} (SIGTERM or Ctrl-C): running this script again "
        "resumes from it\n")
    assert (tmp_path / "seen").read_text() == f"{ckpt}/autoplan-saved-step-autoplan"
    assert list(ckpt.iterdir()) == []  # the step's file is read and removed


def test_every_step_trained_exits_0(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    script = _script(tmp_path, ckpt)
    done = _run(script, status=0, saved=str(STEPS))  # no signal: nothing to add
    assert (done.returncode, done.stdout) == (0, "")
    late = _run(script, status=1, saved=str(STEPS))  # a SIGTERM in the last step
    assert late.returncode == 0, late.stderr
    assert late.stdout == (f"autoplan: trained all {STEPS} steps and saved checkpoint "
                           f"step-00001000 in {ckpt}; torchrun's status was 1 (it exits 1 "
                           "after passing on a SIGTERM or Ctrl-C)\n")


@pytest.mark.parametrize("status", [1, 137])
def test_a_crash_keeps_torchruns_status_and_says_nothing(tmp_path: Path, status: int):
    script = _script(tmp_path, tmp_path / "ckpt")
    res = _run(script, status=status)
    assert res.returncode == status
    assert "autoplan:" not in res.stdout + res.stderr


def test_an_earlier_runs_step_file_is_no_clean_stop_of_this_one(tmp_path: Path):
    """A file an earlier run left (a script killed before it read it) is removed before
    torchrun starts, so this run's crash keeps its status."""
    ckpt = tmp_path / "ckpt"
    script = _script(tmp_path, ckpt)
    ckpt.mkdir()
    (ckpt / "autoplan-saved-step-autoplan").write_text("335\n")
    res = _run(script, status=1)
    assert res.returncode == 1 and "autoplan:" not in res.stdout
    assert list(ckpt.iterdir()) == []


def test_the_resume_line_names_the_written_script(tmp_path: Path, monkeypatch):
    ckpt = tmp_path / "run 1's %s ckpt"
    ckpt.mkdir()
    monkeypatch.chdir(tmp_path)
    script = _script(tmp_path, ckpt, out="jobs/launch $1.sh")
    res = _run(script, status=1, saved="7")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"autoplan: the ranks stopped on a signal after step 7 of {STEPS} and saved checkpoint "
        f"step-00000007 in {ckpt} (SIGTERM or Ctrl-C): bash '{tmp_path}/jobs/launch $1.sh' "
        "resumes from it\n")


def test_on_several_nodes_each_waits_for_rank_0s_file_and_leaves_it(tmp_path: Path):
    """Rank 0 writes the file after the last collective, which may be after this node's ranks
    ended: a failed torchrun waits for it (up to SAVED_STEP_WAIT_S), and leaves it for the
    other nodes' scripts (the next run removes it first)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    script = _script(tmp_path, ckpt, TWO_NODES)
    assert SAVED_STEP_WAIT_S > 1
    res = _run(script, status=1, saved="335", FAKE_LATE="1")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (
        f"autoplan: the ranks stopped on a signal after step 335 of {STEPS} and saved "
        f"checkpoint step-00000335 in {ckpt} (SIGTERM or Ctrl-C): running this script again on "
        "each of the 2 nodes resumes from it\n")
    assert (ckpt / "autoplan-saved-step-autoplan").read_text() == "335\n"
    unset = _env(script, TORCHRUN)
    res = subprocess.run(["bash", str(script)], env=unset | {"FAKE_STATUS": "0"}, text=True,
                         capture_output=True, timeout=60, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (0, "")  # the stale file was removed first
    assert list(ckpt.iterdir()) == []


STOPPED_BY_SIGTERM = """#!/bin/bash
# torchrun as a SIGTERM to the process group finds it: it passes it on (its ranks save step 42,
# rank 0 names it) and exits 1
trap 'printf "42\\n" > "$AUTOPLAN_SAVED_STEP_FILE"; exit 1' TERM
touch "$READY"
while :; do sleep 0.1; done
"""


def test_a_sigterm_to_the_process_group_leaves_the_script_to_read_the_step(tmp_path: Path):
    """bash would die of the SIGTERM that stops torchrun (kill -TERM -- -PGID, as timeout
    sends it) before it read the step: the script traps it and outlives torchrun."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    script = _script(tmp_path, ckpt)
    ready = tmp_path / "ready"
    job = subprocess.Popen(["bash", str(script)], env=_env(script, STOPPED_BY_SIGTERM,
                                                           READY=str(ready)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, start_new_session=True)
    try:
        for _ in range(600):
            if ready.exists() or job.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), job.communicate(timeout=10)
        os.killpg(job.pid, signal.SIGTERM)
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, err
    assert out.startswith(f"autoplan: the ranks stopped on a signal after step 42 of {STEPS} ")


def test_train_tokens_become_steps_as_for_slurm(tmp_path: Path, capsys):
    """--train-tokens takes the SLURM export's conversion (job_length.steps_for_tokens) and
    says it in the header."""
    plan_file = save_plan(ONE_NODE, tmp_path / "plan.yaml")
    per_step = ONE_NODE.batch.global_batch_size * ONE_NODE.model_spec().seq_len
    texts = {}
    for target in ("torchrun", "slurm"):
        out = tmp_path / target
        assert main(["export", str(plan_file), "--to", target, "--train-tokens", "1B",
                     "--out", str(out)]) == 0, capsys.readouterr().err
        texts[target] = out.read_text()
    steps = math.ceil(1e9 / per_step)
    for text in texts.values():
        assert f" --steps {steps} " in text
    header = " ".join(line[2:] for line in texts["torchrun"].splitlines()
                      if line.startswith("# "))
    assert (f"--train-tokens 1,000,000,000: --steps {steps:,}, the tokens over {per_step:,} a step"
            in header)
    assert f"short of {steps} steps" in header
