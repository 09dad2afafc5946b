"""`autoplan search` refuses bad input in one line (exit 2) before any work: a --storage file that
is not an Optuna journal (left as it was), seeds and worker indices the samplers cannot take,
--study or --worker without --storage, and GPU counts or batch sizes in non-ASCII digits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.commands import main
from tests.cli_refusals import assert_refused

SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
          "--global-batch-size", "8", "--space", "small-cpu", "--trials", "3",
          "--format", "json"]


_refused = assert_refused


@pytest.mark.parametrize("text", [
    "hello world\nnot json\n",  # Optuna raised JSONDecodeError here
    "garbage\n",                # one bad last line: Optuna skipped it and appended to the file
    '{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [2]}\nbroken\n',
    "\x00\x01binary",
])
@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_file_that_is_not_a_journal_is_refused_and_left_alone(tmp_path: Path, capsys,
                                                                 text: str, sampler: str) -> None:
    log = tmp_path / "study.log"
    log.write_text(text)
    _refused(capsys, [*SEARCH, "--sampler", sampler, "--storage", f"journal:{log}",
                      "--study", "s"], "--storage", "not an Optuna journal")
    assert log.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.log"]


def test_a_journal_written_by_search_resumes(tmp_path: Path, capsys) -> None:
    log = tmp_path / "study.log"
    argv = [*SEARCH, "--sampler", "random", "--storage", f"journal:{log}", "--study", "s"]
    main(argv)
    first = log.read_text()
    main([*argv, "--trials", "4"])
    capsys.readouterr()
    assert log.read_text().startswith(first) and len(log.read_text()) > len(first)


@pytest.mark.parametrize(("flags", "needle"), [
    (["--sampler", "tpe", "--seed", "-1"], "--seed: got -1; expected 0 to 4294967295"),
    (["--sampler", "random", "--seed", str(2**32)], "--seed: got 4294967296"),
    (["--sampler", "random", "--worker", "-1"], "--worker: got -1; expected 0 to 4294967295"),
])
def test_seeds_and_workers_the_samplers_cannot_take_are_refused(capsys, flags, needle) -> None:
    _refused(capsys, [*SEARCH, *flags], needle)


@pytest.mark.parametrize(("flags", "needle"), [
    (["--study", "s"], "--study: got 's' without --storage"),
    (["--sampler", "random", "--worker", "2"], "--worker: got 2 without --storage"),
])
def test_study_and_worker_need_a_storage_as_in_tune(capsys, flags, needle) -> None:
    _refused(capsys, [*SEARCH, *flags], needle)


@pytest.mark.parametrize(("flag", "value"), [
    ("--num-gpus", "\uff18"),       # a full-width 8: int() reads it, estimate's count() does not
    ("--num-gpus", "1..\uff18"),
    ("--num-gpus", "2,\u0664"),     # an Arabic-Indic 4
    ("--global-batch-size", "\uff18"),
    ("--global-batch-size", "4..1_6"),
])
def test_counts_take_plain_ascii_digits_only(capsys, flag: str, value: str) -> None:
    _refused(capsys, [*SEARCH, flag, value], f"{flag}: got")


def test_ascii_counts_still_search(capsys) -> None:
    assert main([*SEARCH, "--num-gpus", " 2 ", "--global-batch-size", "+8"]) == 0
    assert json.loads(capsys.readouterr().out)["num_gpus"] == [2]


def test_a_journal_damaged_while_open_is_one_config_error() -> None:
    # another writer can damage a line after the check; Optuna then raises JSONDecodeError
    import json as json_module

    from autoplan.errors import ConfigError
    from autoplan.search.storage import journal_errors

    with pytest.raises(ConfigError, match="--storage: the journal 'x.log' cannot be read"):
        with journal_errors("journal:x.log"):
            json_module.loads("not json")
    with pytest.raises(json_module.JSONDecodeError):  # not a journal: not ours to explain
        with journal_errors("sqlite:///x.db"):
            json_module.loads("not json")


def test_a_report_that_fails_leaves_out_unwritten(tmp_path: Path, capsys, monkeypatch) -> None:
    """--out was committed before the report was rendered: a failed report left it behind,
    with no `wrote` line, and the rerun was refused for the --out it had not reported."""
    import autoplan.search.report as report_mod
    from autoplan.errors import ConfigError

    def broken(*_a, **_k):
        raise ConfigError("--report", "cannot write report.html (No space left on device)")

    out, report = tmp_path / "out", tmp_path / "rep"
    exhaustive = [a for a in SEARCH if a not in ("--trials", "3")]
    argv = [*exhaustive, "--out", str(out), "--report", str(report)]
    with monkeypatch.context() as m:
        m.setattr(report_mod, "write_report", broken)
        assert main(argv) == 2
    assert "wrote" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert main(argv) == 0  # the rerun is not refused
    err = capsys.readouterr().err
    assert f"wrote {out / 'plan.yaml'}" in err and f"wrote {report / 'report.html'}" in err


def test_trials_with_the_exhaustive_sampler_is_refused(capsys) -> None:
    """--trials was silently ignored: exhaustive scores every candidate."""
    _refused(capsys, [*SEARCH, "--sampler", "exhaustive"],
             "--trials: got 3 with --sampler exhaustive", "drop --trials")
    exhaustive = [a for a in SEARCH if a not in ("--trials", "3")]
    assert main([*exhaustive, "--sampler", "exhaustive"]) == 0


@pytest.mark.parametrize("value", ["100001", "99999999999", "0"])
def test_an_absurd_trial_count_is_a_typo(capsys, value: str) -> None:
    """Any count was taken (a typo ran for days), as export's --max-restarts refuses."""
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal
        # --top 0 is refused too, later: the parser refuses the count before any search
        main([*SEARCH, "--sampler", "random", "--trials", value, "--top", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--trials: got {value!r}; expected a whole number from 1 to 100,000" in err
