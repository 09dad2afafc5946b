"""Rank 0 names the step of the run's last checkpoint in the file an exported SLURM job gives
in checkpoint_names.SAVED_STEP_ENV, once the run ended cleanly (every rank saved that step): the
job's script reads it, since torchrun exits 1 after a SIGTERM whatever its ranks did
(tests/unit/export/test_slurm_exit.py plays the script's side)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from autoplan.runtime import worker
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV


def _report(monkeypatch, tmp_path: Path, summary: dict | None, *,
            checkpoint_dir: str | None = "ckpt") -> int:
    """worker.run_and_report with the run played by `summary` (None: a rank other than 0)."""
    monkeypatch.setattr(worker, "run", lambda args: summary)
    args = argparse.Namespace(checkpoint_dir=checkpoint_dir, run_record=None,
                              summary_file=str(tmp_path / "summary.json"))
    return worker.run_and_report(args)


def _summary(final_step: int | None, stopped_early: str | None = "SIGTERM") -> dict:
    return {"final_step": final_step, "stopped_early": stopped_early}


@pytest.mark.parametrize("stopped_early", ["SIGTERM", None])
def test_rank_0_names_the_last_saved_step_once_the_run_ended(monkeypatch, tmp_path: Path,
                                                             stopped_early: str | None):
    target = tmp_path / "autoplan-saved-step-42.0"
    monkeypatch.setenv(SAVED_STEP_ENV, str(target))
    assert _report(monkeypatch, tmp_path, _summary(335, stopped_early)) == 0
    assert target.read_text() == "335\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name, "summary.json"]  # no .tmp


@pytest.mark.parametrize("summary, checkpoint_dir", [
    (_summary(335), None),  # nothing was saved
    (_summary(None), "ckpt"),  # no step ran
    (None, "ckpt"),  # a rank other than 0
])
def test_nothing_is_named_without_a_saved_step_or_off_rank_0(monkeypatch, tmp_path: Path,
                                                              summary, checkpoint_dir):
    target = tmp_path / "saved"
    monkeypatch.setenv(SAVED_STEP_ENV, str(target))
    assert _report(monkeypatch, tmp_path, summary, checkpoint_dir=checkpoint_dir) == 0
    assert not target.exists()


def test_outside_an_exported_job_no_file_is_written(monkeypatch, tmp_path: Path):
    monkeypatch.delenv(SAVED_STEP_ENV, raising=False)
    assert _report(monkeypatch, tmp_path, _summary(335)) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_file_that_cannot_be_written_is_warned_about_not_raised(monkeypatch, tmp_path: Path,
                                                                   caplog):
    target = tmp_path / "no-such-folder" / "saved"
    monkeypatch.setenv(SAVED_STEP_ENV, str(target))
    with caplog.at_level(logging.WARNING, logger="autoplan.runtime.worker"):
        assert _report(monkeypatch, tmp_path, _summary(335)) == 0
    assert not target.exists()
    assert f"{SAVED_STEP_ENV}: cannot write {target}" in caplog.text
    assert (tmp_path / "summary.json").exists()  # the rank still reports its run


def test_a_write_that_fails_after_the_temporary_file_leaves_nothing(monkeypatch, tmp_path: Path,
                                                                    caplog):
    """The rename into place fails (a folder holds the name): the `.tmp` written first goes."""
    target = tmp_path / "saved"
    (target / "in-the-way").mkdir(parents=True)
    monkeypatch.setenv(SAVED_STEP_ENV, str(target))
    with caplog.at_level(logging.WARNING, logger="autoplan.runtime.worker"):
        assert _report(monkeypatch, tmp_path, _summary(335)) == 0
    assert f"{SAVED_STEP_ENV}: cannot write {target}" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved", "summary.json"]  # no .tmp
