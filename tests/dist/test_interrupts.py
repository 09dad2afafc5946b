"""#14 items 13 and 14 through the real CLI (2 ranks, torchrun): Ctrl-C, SIGTERM and kill -9 of one
rank leave no live process and no temporary checkpoint, the metrics file has each step once,
and the resumed run ends at the uninterrupted run's final loss, bitwise."""

from __future__ import annotations

import signal
import time

import pytest

from autoplan.plan_files import save_plan
from tests.dist.interrupt import interrupt_and_resume, reference_loss
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

STEPS = 10


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupts")
    plan = str(save_plan(make_plan(dp=2, zero=2), root / "plan.yaml"))
    return plan, reference_loss(plan, STEPS, root)


# SIGTERM takes SIGINT's path (supervise.py and worker.py install one handler for both), so the
# default tier runs Ctrl-C and kill -9 and keeps SIGTERM for `-m slow`: the suite sits at CI's
# 35-minute guideline on a 2-core machine.
@pytest.mark.parametrize(("kind", "at_step", "code"),
                         [("sigint", 3, 130),
                          pytest.param("sigterm", 4, 143, marks=pytest.mark.slow),
                          ("kill9", 5, 0)])
def test_interrupt_then_resume_matches_an_uninterrupted_run(job, tmp_path, kind, at_step, code):
    plan, ref = job
    res = interrupt_and_resume(plan, STEPS, tmp_path, kind, at_step)
    assert not res.problems(STEPS, ref), (res.problems(STEPS, ref), res.stderr[-3000:])
    assert res.codes[0] == code, res.stderr[-3000:]
    if kind != "kill9":
        last = [ln for ln in res.stderr.splitlines() if ln.startswith("autoplan train: error")]
        assert len(last) == 1 and "continue with --resume" in last[0], res.stderr[-3000:]
    else:
        _assert_one_line_says_the_death(res.stderr)
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    kept = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert len(kept) <= 3 and kept[-1] == f"step-{STEPS:08d}", kept  # pruned to the newest 3


def _assert_one_line_says_the_death(stderr: str) -> None:
    """rank 1 was SIGKILLed: rank 0's failed collective prints no traceback (it once printed
    ~45 lines of gloo's "Connection reset by peer", and torchrun two lines more); one line
    names the rank, the signal and the step every rank resumes from, the one loaded."""
    import re

    said = [ln for ln in stderr.splitlines()
            if not ln.startswith("step ") and not ln.startswith("[rank0] INFO ")]
    assert len(said) == 1, stderr[-3000:]
    found = re.fullmatch(r"\[rank0\] WARNING autoplan\.runtime\.worker: restart 1 of 1: rank 1 was "
                         r"killed by SIGKILL; every rank resumes from checkpoint step (\d+)", said[0])
    assert found, said
    assert f"step-{int(found[1]):08d} (step {found[1]})" in stderr, stderr[-3000:]
    assert "Connection" not in stderr and "closing signal" not in stderr, stderr[-3000:]


def _start(plan: str, tmp_path):
    import os
    import subprocess

    from tests.dist.interrupt import metrics_steps, train_cmd

    metrics = tmp_path / "m.jsonl"
    proc = subprocess.Popen(train_cmd(plan, 200, tmp_path / "ck", metrics), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
    while proc.poll() is None and len(metrics_steps(metrics)) < 2:
        time.sleep(0.02)
    return proc


def _gone(marker: str, within_s: float) -> list[int]:
    from tests.dist.interrupt import _ranks

    deadline = time.monotonic() + within_s
    while _ranks(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _ranks(marker)


def test_a_second_ctrl_c_stops_everything_now(job, tmp_path):
    plan, _ = job
    proc = _start(plan, tmp_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "killed torchrun and the ranks" in err, err[-3000:]
    assert not _gone(str(tmp_path / "ck"), 10)
    assert not list((tmp_path / "ck").glob("*.tmp"))


def test_ranks_stop_when_the_cli_is_killed(job, tmp_path):
    """kill -9 of the CLI (a pruned tune trial, a closed terminal): torchrun and the ranks run
    in sessions of their own, so they notice the CLI is gone and stop after their step."""
    plan, _ = job
    proc = _start(plan, tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    assert not _gone(str(tmp_path / "ck"), 90)
