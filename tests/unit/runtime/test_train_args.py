"""#14 item 10: every `autoplan train` value is checked before torchrun starts (one line, exit
2); #16 item 2: the run record `train --run-record` writes is what `autoplan calibrate` reads."""

from __future__ import annotations

import json

import pytest

from autoplan.calibrate import load_run
from autoplan.commands import main
from autoplan.plan_files import save_plan
from autoplan.runtime.metrics import MetricsSink, StepMetrics, truncate_after
from autoplan.runtime.summary import summarize, write_run_record
from tests.dist.parity import make_plan

BAD = [
    (["--pg-timeout-s", "nan"], "--pg-timeout-s"),
    (["--pg-timeout-s", "-1"], "--pg-timeout-s"),
    (["--pg-timeout-s", "1e300"], "--pg-timeout-s"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "0"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--dropout", "1.5"], "--dropout"),
    (["--dropout", "-0.1"], "--dropout"),
    (["--max-grad-norm", "nan"], "--max-grad-norm"),
    (["--max-restarts", "-1"], "--max-restarts"),
    (["--checkpoint-every", "-2"], "--checkpoint-every"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints"),
    (["--steps", "0"], "--steps"),
    (["--nproc", "0"], "--nproc"),
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**70)], "--seed"),
    (["--checkpoint-dir", "{file}"], "--checkpoint-dir"),
    (["--checkpoint-dir", "{file}/sub"], "--checkpoint-dir"),
    (["--metrics-file", "{file}/m.jsonl"], "--metrics-file"),
    (["--metrics-file", "{file}"], "--metrics-file"),  # exists, no --resume: never appended
    (["--metrics-file", "{dir}"], "--metrics-file"),
    (["--run-record", "{file}"], "--run-record"),
    (["--resume"], "--checkpoint-dir"),
]


@pytest.mark.parametrize(("flags", "field"), BAD, ids=[" ".join(f) for f, _ in BAD])
def test_bad_train_flags_exit_2_in_one_line_before_launch(tmp_path, capsys, flags, field):
    plan = save_plan(make_plan(dp=2), tmp_path / "plan.yaml")
    afile = tmp_path / "afile"
    afile.write_text("x")
    flags = [f.format(file=afile, dir=tmp_path) for f in flags]
    try:  # a value that is no number is argparse's refusal (SystemExit), a range the check's
        code = main(["train", str(plan), "--steps", "2", *flags])  # a repeated flag: last wins
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and field in err, err


REFUSED = [  # each once trained first, or crashed in the ranks, or named the wrong problem
    (["--metrics-file", "{dir}/out.json", "--run-record", "{dir}/out.json"],
     "--run-record: '{dir}/out.json' is also given to --metrics-file"),
    (["--checkpoint-dir", "{dir}/ck", "--metrics-file", "{dir}/./ck"],
     "--metrics-file: '{dir}/./ck' is also given to --checkpoint-dir"),
    (["--space", "small-cpu"], "--space: got 'small-cpu' without --elastic"),
    (["--run-record", "{dir}"], "--run-record: '{dir}' is a folder"),
    (["--metrics-file", "/proc/autoplan-no-such/m.jsonl"],
     "--metrics-file: cannot create anything in '/proc'"),
    (["--data", "{empty}"], "--data: '{empty}' holds 0 bytes"),
]


@pytest.mark.parametrize(("flags", "needle"), REFUSED, ids=[" ".join(f) for f, _ in REFUSED])
def test_train_refuses_before_launch_naming_the_problem(tmp_path, capsys, flags, needle):
    plan = save_plan(make_plan(dp=2), tmp_path / "plan.yaml")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    fill = {"dir": tmp_path, "empty": empty}
    flags = [f.format(**fill) for f in flags]
    code = main(["train", str(plan), "--steps", "2", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and needle.format(**fill) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "plan.yaml"]


def test_metrics_file_keeps_each_step_once_after_a_resume(tmp_path):
    assert MetricsSink(str(tmp_path / "new" / "m.jsonl"), live=False).path.parent.is_dir()
    path = tmp_path / "m.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(1, 9)]
    path.write_text("\n".join(lines) + '\n{"step": 9, "lo')  # killed mid-line at step 9
    sink = MetricsSink(str(path), live=False, resumed_step=5)  # resumed from step 5
    for step in (6, 7):
        sink.record(StepMetrics(step, 1.0, 0.1, 10.0, 1, 0.5))
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6, 7]
    summary = summarize(sink.history, make_plan(), resumed_step=5)
    assert (summary["steps"], summary["steps_this_run"], summary["resumed_from"]) == (7, 2, 5)
    assert truncate_after(path, 0) == 0 and path.read_text() == ""


def test_run_record_is_what_calibrate_reads(tmp_path):
    plan = make_plan(dp=2, zero=1)
    sink = MetricsSink(None, live=False)
    for step in (1, 2, 3):
        sink.record(StepMetrics(step, 1.0, 0.2 + 0.01 * step, 10.0, 3 << 20, 0.5))
    summary = summarize(sink.history, plan)
    path = tmp_path / "run.json"
    write_run_record(str(path), summary, plan)
    run = load_run(path)
    assert run.plan == plan and run.profile == "cpu-gloo"
    assert run.measured.step_time_s == pytest.approx(0.225)
    assert run.measured.peak_memory_bytes == 3 << 20 and run.measured.steps == 3
    before = path.read_bytes()  # never replaced: a path taken meanwhile gets a sibling
    assert write_run_record(str(path), summary, plan) == tmp_path / "run.1.json"
    assert path.read_bytes() == before


def _big_plan(tmp_path):
    """gpt3-175b on one cpu-gloo rank: valid by the rules, thousands of GiB over the 4 GiB."""
    import dataclasses

    return save_plan(dataclasses.replace(make_plan(), model="gpt3-175b", batch=make_plan(
        mbs=1, gbs=1).batch), tmp_path / "big.yaml")


def test_train_refuses_a_plan_that_does_not_fit_before_launch(tmp_path, capsys, monkeypatch):
    """It once launched torchrun and died in the ranks (a 77-line traceback, or an OOM kill)."""
    import autoplan.runtime.supervise as supervise

    def no_launch(*_a, **_k):
        raise AssertionError("torchrun launched")

    monkeypatch.setattr(supervise, "run_supervised", no_launch)
    plan = _big_plan(tmp_path)
    code = main(["train", str(plan), "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert len(err.splitlines()) == 1, err
    assert "does not fit 1 x cpu-gloo" in err and "GiB per GPU of 4.0 GiB (short by" in err, err
    assert "--no-memory-check" in err, err


def test_no_memory_check_launches_anyway(tmp_path, capsys, monkeypatch):
    import autoplan.runtime.supervise as supervise

    launched = []

    def fake_launch(cmd, *_a, **_k):
        launched.append(cmd)
        return supervise.Outcome(returncode=1)

    monkeypatch.setattr(supervise, "run_supervised", fake_launch)
    plan = _big_plan(tmp_path)
    code = main(["train", str(plan), "--steps", "1", "--no-memory-check"])
    assert code == 1 and len(launched) == 1, capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--data", "--checkpoint-dir", "--metrics-file",
                                  "--run-record"])
def test_an_empty_path_is_refused_not_taken_as_the_current_folder(tmp_path, capsys, flag):
    """`--data ''` trained on every file of the current folder, the plan included, and
    `--checkpoint-dir ''` wrote step folders into it."""
    plan = tmp_path / "plan.yaml"
    save_plan(make_plan(), plan)
    assert main(["train", str(plan), "--steps", "1", flag, ""]) == 2
    err = capsys.readouterr().err
    assert f"{flag}: got an empty path" in err and len(err.strip().splitlines()) == 1


def test_an_unreadable_data_file_is_one_line(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from autoplan.runtime.data import ByteText

    (tmp_path / "a.txt").write_text("x" * 100)

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(Exception) as err:
        ByteText(tmp_path, 8)
    assert type(err.value).__name__ == "ConfigError"
    assert "--data: cannot read" in str(err.value) and "Permission denied" in str(err.value)
