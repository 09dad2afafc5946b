"""A journal whose lines are JSON objects with an `op_code` but no operation Optuna can replay
(an unknown code, a missing field) is refused in one line naming it, by search and tune alike,
instead of Optuna's AssertionError or KeyError traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main

SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
          "--global-batch-size", "16", "--space", "small-cpu", "--sampler", "random",
          "--trials", "3"]
TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2", "--top", "1", "--dry-run"]


@pytest.mark.parametrize("argv", [SEARCH, TUNE], ids=["search", "tune --dry-run"])
@pytest.mark.parametrize(("text", "why"), [
    ('{"op_code": 99}\n', "AssertionError"),
    ('{"op_code": 0}\n', "KeyError: 'study_name'"),
])
def test_a_journal_optuna_cannot_replay_is_one_line(tmp_path: Path, capsys, argv: list[str],
                                                     text: str, why: str) -> None:
    log = tmp_path / "j.log"
    log.write_text(text)
    assert main([*argv, "--storage", f"journal:{log}", "--study", "s"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and not captured.out, err
    assert f"--storage: the journal {str(log)!r} cannot be read ({why}" in err, err
    assert log.read_text() == text
