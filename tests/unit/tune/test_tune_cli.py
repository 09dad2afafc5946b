"""`autoplan tune` refuses bad input before any trial runs (one line, exit 2): non-finite
budgets, a --storage file that is not a journal, an --out that is a file; says what came
closest when nothing is feasible (exit 3); and writes its result files whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan import plan_from_dict
from autoplan.tune.cli import OUT_FILES, _write_out

TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2"]


def _fails(capsys, argv: list[str], code: int, *needles: str) -> None:
    got = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert got == code, err
    assert len(err.splitlines()) == 1 and not captured.out, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(("flag", "value"), [
    ("--budget-s", "nan"), ("--budget-s", "inf"), ("--trial-timeout-s", "nan"),
    ("--prune-ratio", "nan"), ("--prune-ratio", "inf"),
])
def test_non_finite_budgets_are_refused(capsys, flag: str, value: str) -> None:
    _fails(capsys, [*TUNE, flag, value, "--dry-run"], 2, f"{flag}: got {value}")


def test_a_storage_file_that_is_not_a_journal_is_refused_and_left_alone(tmp_path: Path,
                                                                        capsys) -> None:
    log = tmp_path / "tune.log"
    log.write_text("garbage\n")
    _fails(capsys, [*TUNE, "--storage", f"journal:{log}", "--study", "s"], 2,
           "--storage", "not an Optuna journal")
    assert log.read_text() == "garbage\n"


def test_an_out_that_is_a_file_is_refused_before_any_trial(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    _fails(capsys, [*TUNE, "--out", str(afile)], 2, "--out", "is a file")
    assert afile.read_text() == "mine"


def test_an_out_holding_results_needs_force(tmp_path: Path, capsys) -> None:
    (tmp_path / "summary.json").write_text("{}")
    _fails(capsys, [*TUNE, "--out", str(tmp_path)], 2, "already holds summary.json",
           "--force")


def test_nothing_feasible_names_the_nearest_miss(capsys) -> None:
    _fails(capsys, ["tune", "--model", "gpt3-1.3b", "--cluster", "cpu-gloo", "--num-gpus", "1",
                    "--global-batch-size", "2", "--dry-run"], 3,
           "no feasible plan among", "nearest (out-of-memory)", "GiB of 4 GiB per GPU")


def test_result_files_are_written_whole_or_not_at_all(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "trials").mkdir(parents=True)  # the tune's own work stays beside the results
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    rows = [{"key": "a", "status": "complete"}]
    circular: dict = {}
    circular["self"] = circular  # summary.json cannot be written: after plan.yaml was, before
    with pytest.raises(ValueError):
        _write_out(out, circular, rows, plan, force=False)
    assert sorted(p.name for p in out.iterdir()) == ["trials"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    _write_out(out, {"trials": rows}, rows, plan, force=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUT_FILES, "trials"])
