"""export --to slurm --requeue: a job whose ranks stopped short of --steps after a clean save
requeues itself (`scontrol requeue $SLURM_JOB_ID`), so it resumes when it runs again and ends
COMPLETED only once every step is trained; a requeue SLURM refuses exits 1 with a line; a crash
or a finished run never requeues. The generated script runs under bash with srun and scontrol
stubbed, as tests/unit/export/test_slurm_exit.py does."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan_files import save_plan

from .cases import CASES
from .test_slurm_exit import STEPS, _run, _script

SCONTROL = """#!/bin/bash
# `show hostnames` for the rendezvous; `requeue JOB` recorded, its status $FAKE_REQUEUE
if [ "$1" = requeue ]; then echo "$2" >> "$REQUEUED"; exit "${FAKE_REQUEUE:-0}"; fi
echo node1
"""


def _go(tmp_path: Path, **kw):
    """The --requeue script of dp-zero1 run with the recording scontrol: (result, job ids it
    requeued)."""
    ckpt = tmp_path / "ckpt"
    script, _ = _script(tmp_path, ckpt, requeue=True)
    log = tmp_path / "requeued"
    res = _run(script, scontrol=SCONTROL, REQUEUED=str(log), **kw)
    return res, (log.read_text().split() if log.exists() else [])


def test_the_directives_come_only_with_the_flag(tmp_path: Path) -> None:
    on, _ = _script(tmp_path, tmp_path / "c1", requeue=True)
    text = on.read_text()
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in text
    assert "so an afterok dependency waits for the trained model" in text
    off, _ = _script(tmp_path, tmp_path / "c2")
    text = off.read_text()
    assert "#SBATCH --requeue" not in text and "scontrol requeue" not in text


def test_a_clean_stop_requeues_the_job(tmp_path: Path) -> None:
    res, requeued = _go(tmp_path, status=1, saved="335")
    assert res.returncode == 0, res.stderr
    assert requeued == ["42"]
    assert res.stdout == (
        f"autoplan: the ranks stopped on SIGTERM after step 335 of {STEPS} and saved checkpoint "
        f"step-00000335 in {tmp_path / 'ckpt'} (the time-limit warning that --signal sets, or a"
        " scancel --signal=TERM): requeueing job 42, which resumes from it when it runs again\n")


def test_a_refused_requeue_exits_1_and_says_so(tmp_path: Path) -> None:
    res, requeued = _go(tmp_path, status=1, saved="335", FAKE_REQUEUE="1")
    assert res.returncode == 1 and requeued == ["42"]
    assert res.stdout.splitlines()[-1] == (
        "autoplan: scontrol requeue 42 was refused (the job or partition may not allow "
        "requeue): submit this script again to resume")


@pytest.mark.parametrize(("status", "saved", "code"),
                         [(1, str(STEPS), 0), (0, str(STEPS), 0), (137, None, 137)])
def test_a_finished_run_or_a_crash_never_requeues(tmp_path: Path, status, saved, code) -> None:
    res, requeued = _go(tmp_path, status=status, saved=saved)
    assert requeued == [] and res.returncode == code


def test_requeue_is_refused_by_targets_that_do_not_write_it(tmp_path: Path, capsys) -> None:
    plan = save_plan(CASES["dp-zero1"][0], tmp_path / "plan.yaml")
    out = tmp_path / "run.sh"
    code = main(["export", str(plan), "--to", "torchrun", "--requeue", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--requeue" in err and "slurm" in err
    assert not out.exists()
    assert main(["export", str(plan), "--to", "slurm", "--requeue",
                 "--out", str(tmp_path / "job.sbatch")]) == 0
    assert "#SBATCH --requeue" in (tmp_path / "job.sbatch").read_text()
