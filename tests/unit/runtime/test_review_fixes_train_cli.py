"""Review fixes of `autoplan train`, through the real CLI with torchrun replaced by a fake that
writes the summary rank 0 would: --metrics-file with --resume refuses a file that is not a
run's step records, cluster.profile must load, a --run-record path taken during the run keeps
the result, and `~` in `--flag=~/x` is expanded where it is checked and where it is written."""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.plan import ClusterRef
from autoplan.plan_files import save_plan
from autoplan.runtime.metrics import MetricsSink, StepMetrics
from autoplan.runtime.summary import summarize
from tests.cli_refusals import assert_refused
from tests.dist.parity import make_plan


def _records(steps) -> str:
    return "".join(json.dumps(asdict(StepMetrics(s, 5.0 - 0.1 * s, 0.05, 1e4, 1 << 20, 0.5)))
                   + "\n" for s in steps)


class FakeLaunch:
    """Stands in for run_supervised: records the torchrun command, runs `during` (something
    that happens while the ranks train) and writes the summary rank 0 writes."""

    def __init__(self, during=None) -> None:
        self.commands: list[list[str]] = []
        self.during = during

    def __call__(self, cmd, *_args, **_kwargs):
        from autoplan.runtime.supervise import Outcome

        self.commands.append(cmd)
        if self.during is not None:
            self.during()
        sink = MetricsSink(None, live=False)
        for step in (1, 2, 3):
            sink.record(StepMetrics(step, 5.0, 0.05, 1e4, 1 << 20, 0.5))
        summary_file = cmd[cmd.index("--summary-file") + 1]
        Path(summary_file).write_text(json.dumps(summarize(sink.history, make_plan())))
        return Outcome(returncode=0)

    def flag(self, name: str) -> str:
        cmd = self.commands[-1]
        return cmd[cmd.index(name) + 1]


@pytest.fixture
def launch(monkeypatch):
    fake = FakeLaunch()
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", fake)
    return fake


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*_args, **_kwargs):
        raise AssertionError("torchrun was launched")

    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", launched)


def _parse(argv: list[str]):
    import argparse

    from autoplan.runtime.cli import add_train_arguments

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(argv)


# -- 1. --metrics-file with --resume --------------------------------------------------------

SUMMARY_JSON = json.dumps({"steps": 4, "final_loss": 5.4663, "measured": {
    "step_time_s": 0.045, "tokens_per_s": 22613.9}, "predicted": None}, indent=2) + "\n"


@pytest.mark.parametrize(("content", "line"), [
    (SUMMARY_JSON, 1),  # the reviewer's victim: a 529-byte summary.json became one metrics line
    ('{"step": 1, "loss": 1.0}\n', 1),  # JSON lines, not the records the runtime writes
    (_records([1, 2]) + "some notes\n", 3),  # a run's records with a foreign line in them
    ("hello", 1),  # no newline at all: not the start of a torn record
], ids=["json", "other-jsonl", "mixed", "text"])
def test_resume_refuses_a_metrics_file_that_is_not_a_runs_records(tmp_path, capsys, no_launch,
                                                                  content, line):
    """The reviewer's case: ck holds a step-4 checkpoint of this run, so every other check
    passes and the ranks cut the file to the new step's line."""
    from tests.unit.runtime.test_checkpoint_compat import _save

    plan = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))
    _save(tmp_path / "ck" / "step-00000004", step=4)
    victim = tmp_path / "victim.json"
    victim.write_text(content)
    before = victim.read_bytes()
    assert_refused(capsys, ["train", plan, "--steps", "5", "--resume", "--checkpoint-dir",
                            str(tmp_path / "ck"), "--metrics-file", str(victim)],
                   f"--metrics-file: {str(victim)!r} is not a metrics file of autoplan train "
                   f"(line {line} is not a step record", "--resume would cut it",
                   "give another path")
    assert victim.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "plan.yaml", "victim.json"]


def test_an_output_on_the_plan_file_is_refused(tmp_path, capsys, no_launch):
    plan = save_plan(make_plan(), tmp_path / "plan.yaml")
    before = plan.read_bytes()
    assert_refused(capsys, ["train", str(plan), "--steps", "5", "--resume", "--checkpoint-dir",
                            str(tmp_path / "ck"), "--metrics-file", str(plan)],
                   f"--metrics-file: {str(plan)!r} is the plan file", "another path")
    data = tmp_path / "corpus.txt"
    data.write_text("some text to train on " * 50)
    assert_refused(capsys, ["train", str(plan), "--steps", "5", "--resume", "--checkpoint-dir",
                            str(tmp_path / "ck"), "--data", str(data),
                            "--metrics-file", str(tmp_path / "." / "corpus.txt")],
                   "is --data", "another path")
    assert plan.read_bytes() == before


def test_resume_continues_a_real_metrics_file_and_cuts_it_at_the_resumed_step(tmp_path):
    """A file an earlier run wrote (killed mid-line at step 7) passes the check and is cut to
    the resumed step, as documented."""
    from autoplan.runtime.train_args import check_train_args

    plan = str(save_plan(make_plan(), tmp_path / "plan.yaml"))
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(_records(range(1, 7)) + '{"step": 7, "lo')
    args = _parse([plan, "--steps", "8", "--resume", "--checkpoint-dir", str(tmp_path / "ck"),
                   "--metrics-file", str(metrics)])
    check_train_args(args)  # accepted
    sink = MetricsSink(args.metrics_file, live=False, resumed_step=4)
    sink.record(StepMetrics(5, 4.5, 0.05, 1e4, 1 << 20, 0.5))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[-1]["loss"] == 4.5


# -- 2. cluster.profile must load ------------------------------------------------------------

def _plan_on(tmp_path: Path, profile: str) -> str:
    plan = dataclasses.replace(make_plan(), cluster=ClusterRef(profile=profile, num_gpus=1))
    return str(save_plan(plan, tmp_path / "plan.yaml"))


@pytest.mark.parametrize("memory_check", [[], ["--no-memory-check"]], ids=["check", "no-check"])
def test_a_profile_path_that_does_not_resolve_is_refused(tmp_path, capsys, no_launch,
                                                        monkeypatch, memory_check):
    """It logged INFO, skipped the memory check and printed "predicted": null."""
    monkeypatch.chdir(tmp_path)
    plan = _plan_on(tmp_path, "profs/my.yaml")
    assert_refused(capsys, ["train", plan, "--steps", "2", *memory_check],  # the plan's folder's
                   f"cluster.profile: '{tmp_path / 'profs' / 'my.yaml'}' cannot be loaded: no "
                   "such file", "give a path that exists (a relative one from the plan's folder), or a profile name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_an_unknown_profile_name_is_refused_with_the_names(tmp_path, capsys, no_launch):
    plan = _plan_on(tmp_path, "no-such-machine")
    assert_refused(capsys, ["train", plan, "--steps", "2"],
                   "cluster.profile: 'no-such-machine' cannot be loaded: no profile of that "
                   "name (", "cpu-gloo", "give a path that exists (a relative one from the plan's folder), or a profile name")


def test_a_profile_path_from_here_is_priced(tmp_path, capsys, launch, monkeypatch):
    from autoplan.hardware import PROFILES_DIR

    monkeypatch.chdir(tmp_path)
    (tmp_path / "profs").mkdir()
    shutil.copy(PROFILES_DIR / "cpu-gloo.yaml", tmp_path / "profs" / "my.yaml")
    plan = _plan_on(tmp_path, "profs/my.yaml")
    assert main(["train", plan, "--steps", "3", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["final_step"] == 3 and len(launch.commands) == 1


def test_ranks_a_scheduler_started_still_train_a_plan_whose_profile_stayed_behind(tmp_path):
    """The case None was kept for: an exported job's ranks on a site without the profile file
    (the launcher, which refuses it, does not run there)."""
    from autoplan.plan_files import load_plan
    from autoplan.runtime.validation import plan_cluster, runtime_problems

    plan = load_plan(_plan_on(tmp_path, str(tmp_path / "elsewhere" / "site.yaml")))
    assert plan_cluster(plan) is None
    assert runtime_problems(plan, plan.model_spec()) == []


# -- 3. a --run-record path taken during the run ---------------------------------------------

def test_a_run_record_path_taken_during_the_run_keeps_the_result(tmp_path, capsys, monkeypatch,
                                                                 caplog):
    """It exited 2 after training with no summary, naming "output" and a --force train lacks.
    The notice is a WARNING log line (stderr under the CLI's logging; caplog here)."""
    record = tmp_path / "race.json"
    fake = FakeLaunch(during=lambda: record.write_text("{}"))
    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", fake)
    plan = str(save_plan(make_plan(), tmp_path / "plan.yaml"))
    code = main(["train", plan, "--steps", "3", "--run-record", str(record), "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["final_step"] == 3
    assert record.read_text() == "{}"  # not overwritten
    sibling = tmp_path / "race.1.json"
    assert json.loads(sibling.read_text())["measured"]["steps"] == 3
    notes = [r.getMessage() for r in caplog.records if "--run-record" in r.getMessage()]
    assert len(notes) == 1 and str(sibling) in notes[0] and str(record) in notes[0], notes
    assert "\n" not in notes[0] and caplog.records[-1].levelname == "WARNING"
    assert "--force" not in captured.err + notes[0]


# -- 6. `~` after `=` ------------------------------------------------------------------------

@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    return home


def test_tilde_in_output_flags_is_written_where_it_was_checked(tmp_path, home, capsys, launch):
    """bash leaves `~` in `--flag=~/x`: it was checked under $HOME but written to ./~/."""
    plan = str(save_plan(make_plan(), tmp_path / "plan.yaml"))
    (home / "corpus.txt").write_text("some text to train on " * 50)
    code = main(["train", plan, "--steps", "3", "--metrics-file=~/m.jsonl",
                 "--checkpoint-dir=~/ck", "--run-record=~/r.json", "--data=~/corpus.txt",
                 "--format", "json"])
    assert code == 0, capsys.readouterr().err
    assert launch.flag("--metrics-file") == str(home / "m.jsonl")
    assert launch.flag("--checkpoint-dir") == str(home / "ck")
    assert launch.flag("--data") == str(home / "corpus.txt")
    assert json.loads((home / "r.json").read_text())["measured"]["steps"] == 3
    assert not (tmp_path / "work" / "~").exists()


def test_tilde_output_that_exists_is_refused(tmp_path, home, capsys, no_launch):
    """The existence check looked at ./~/m.jsonl while the write went... to ./~/m.jsonl too,
    past the user's ~/m.jsonl: now both look at $HOME."""
    plan = str(save_plan(make_plan(), tmp_path / "plan.yaml"))
    (home / "m.jsonl").write_text(_records([1]))
    (home / "r.json").write_text("{}")
    assert_refused(capsys, ["train", plan, "--steps", "2", "--metrics-file=~/m.jsonl"],
                   f"--metrics-file: {str(home / 'm.jsonl')!r} already exists")
    assert_refused(capsys, ["train", plan, "--steps", "2", "--run-record=~/r.json"],
                   f"--run-record: {str(home / 'r.json')!r} already exists")
    assert not (tmp_path / "work" / "~").exists()
