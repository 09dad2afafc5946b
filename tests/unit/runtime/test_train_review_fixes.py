"""Review fixes of `autoplan train`: outputs inside the --data folder and an edited corpus are
refused, the corpus stays uint8, a rank's refusal reaches the user as one line with its exit
code, --pg-timeout-s has a floor, the second Ctrl-C says what was saved, the summary notes a
device mismatch and a diverged loss (JSONL stays JSON), --dropout is named on resume, step
folders of any width are found, and the --data messages state the true bound."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from autoplan.errors import ConfigError, InfeasiblePlanError
from autoplan.plan_files import save_plan
from autoplan.runtime.checkpoint_compat import RunSettings
from autoplan.runtime.data import ByteText, scan_corpus
from autoplan.runtime.metrics import MetricsSink, StepMetrics, metrics_file_problem
from autoplan.runtime.summary import render_summary, summarize
from tests.cli_refusals import assert_refused
from tests.dist.parity import make_plan

SEQ = 32  # h8-2l's seq_len


@pytest.fixture
def no_launch(monkeypatch):
    def launched(*_args, **_kwargs):
        raise AssertionError("torchrun was launched")

    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", launched)


@pytest.fixture
def plan(tmp_path) -> str:
    return str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))


def _corpus(folder: Path) -> Path:
    folder.mkdir()
    (folder / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    return folder


# -- 1. outputs inside --data, an edited corpus ----------------------------------------------

@pytest.mark.parametrize("flag", ["--metrics-file", "--checkpoint-dir", "--run-record"])
def test_an_output_inside_the_data_folder_is_refused(tmp_path, capsys, no_launch, plan, flag):
    data = _corpus(tmp_path / "corpus")
    inside = str(data / "sub" / "out")
    assert_refused(capsys, ["train", plan, "--steps", "2", "--data", str(data), flag, inside],
                   f"{flag}: {inside!r} is inside the --data folder", "outside it")
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"]


def _saved_on(tmp_path: Path, data: Path) -> Path:
    from tests.unit.runtime.test_checkpoint_compat import ADAMW, _save

    run = RunSettings(**{**ADAMW.__dict__, "data": str(data.resolve()),
                         "data_fingerprint": scan_corpus(data, SEQ)})
    _save(tmp_path / "ck" / "step-00000005", step=5, run=run)
    return tmp_path / "ck"


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: (d / "b.txt").write_text("more"), "b.txt added"),
    (lambda d: (d / "a.txt").write_text("x" * 2000), "a.txt was 1760 bytes, now 2000"),
    (lambda d: (d / "a.txt").write_text("y" * 1760), "same 1 file(s) and sizes, other content"),
], ids=["added", "resized", "same-size"])
def test_resume_refuses_an_edited_corpus(tmp_path, capsys, no_launch, plan, edit, needle):
    data = _corpus(tmp_path / "corpus")
    ck = _saved_on(tmp_path, data)
    edit(data)
    assert_refused(capsys, ["train", plan, "--steps", "8", "--resume", "--checkpoint-dir",
                            str(ck), "--data", str(data)],
                   f"--data: {data.resolve()} changed since step-00000005 was saved", needle,
                   "restore the files")


def test_the_ranks_and_the_launcher_fingerprint_a_corpus_alike(tmp_path):
    """The rank compares ByteText's fingerprint, the launcher scan_corpus's: one corpus, one
    print, and an unchanged corpus resumes."""
    from autoplan.runtime.checkpoint_compat import check_settings
    from autoplan.runtime.checkpoint_files import verify

    data = _corpus(tmp_path / "corpus")
    (data / "deep").mkdir()
    (data / "deep" / "b.txt").write_text("second file\n" * 10)
    assert ByteText(data, SEQ).fingerprint == scan_corpus(data, SEQ)
    found = verify(_saved_on(tmp_path, data) / "step-00000005")
    args = argparse.Namespace(optimizer="adamw", lr=1e-3, data=str(data), seed=0)
    same = RunSettings.of(args, make_plan("h8-2l"), data_fingerprint=ByteText(data, SEQ)
                          .fingerprint)
    assert check_settings(found, same) is None
    (data / "deep" / "b.txt").write_text("second file\n" * 11)
    with pytest.raises(ConfigError, match="deep/b.txt was 120 bytes, now 132"):
        check_settings(found, RunSettings.of(args, make_plan("h8-2l"),
                                             data_fingerprint=ByteText(data, SEQ).fingerprint))


# -- 2. bytes stay bytes -------------------------------------------------------------------

def test_the_corpus_is_held_as_uint8_and_the_launcher_never_loads_it(tmp_path, monkeypatch):
    from autoplan.runtime.launch import data_preflight

    data = _corpus(tmp_path / "corpus")
    src = ByteText(data, SEQ)
    assert src.tokens.dtype == torch.uint8 and src.tokens.numel() == 1760
    sample = src.sample(3)
    assert sample.dtype == torch.int64 and sample.shape == (SEQ + 1,)
    raw = (data / "a.txt").read_bytes()
    start = int(src._perm(0)[3]) * SEQ
    assert sample.tolist() == list(raw[start:start + SEQ + 1])

    def loaded(*_a, **_k):
        raise AssertionError("the launcher loaded the corpus")

    monkeypatch.setattr("autoplan.runtime.data.ByteText", loaded)
    args = argparse.Namespace(data=str(data), seed=0)
    assert data_preflight(args, make_plan("h8-2l").model_spec()) == src.fingerprint


# -- 3. a rank's refusal -------------------------------------------------------------------

REFUSAL = "--checkpoint-dir: no intact checkpoint in /x (step-00000004: CheckpointException)"


def test_a_rank_hands_its_refusal_to_the_launcher(tmp_path, monkeypatch, capsys):
    from autoplan.runtime import worker
    from autoplan.runtime.rank_errors import read_rank_error

    def refuse(_args):
        raise ConfigError("--checkpoint-dir", "no intact checkpoint in /x "
                          "(step-00000004: CheckpointException)")

    monkeypatch.setattr(worker, "run_and_report", refuse)
    monkeypatch.setenv("RANK", "1")
    code = worker.main([str(tmp_path / "plan.yaml"), "--summary-file",
                        str(tmp_path / "summary.json")])
    assert code == 2 and capsys.readouterr().err == ""  # the launcher says it, once
    err = read_rank_error(str(tmp_path))
    assert err is not None and str(err) == REFUSAL and err.exit_code == 2


def test_the_launcher_says_a_ranks_refusal_in_one_line_with_its_code(tmp_path, capsys,
                                                                     monkeypatch, plan):
    from autoplan.runtime.rank_errors import write_rank_error
    from autoplan.runtime.supervise import Outcome

    def refusing_ranks(cmd, *_args, **_kwargs):
        folder = str(Path(cmd[cmd.index("--summary-file") + 1]).parent)
        write_rank_error(folder, 0, ConfigError("--checkpoint-dir", "no intact checkpoint in "
                                                "/x (step-00000004: CheckpointException)"))
        return Outcome(returncode=1)

    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", refusing_ranks)
    assert_refused(capsys, ["train", plan, "--steps", "2"], f"autoplan train: error: {REFUSAL}")


def test_only_the_last_attempts_refusal_is_read(tmp_path, monkeypatch):
    """Under --max-restarts: a refusal from attempt 0 is not why attempt 1 failed. Attempt 1
    started (its marker) and wrote none: nothing is read, so the launcher reports the failure
    as a failure; a refusal attempt 1 writes is read, whatever attempt 0 wrote."""
    from autoplan.runtime.rank_errors import mark_attempt, read_rank_error, write_rank_error

    folder = str(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    mark_attempt(folder)
    write_rank_error(folder, 0, ConfigError("--data", "first attempt's refusal"))
    assert "first attempt" in str(read_rank_error(folder))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    mark_attempt(folder)
    assert read_rank_error(folder) is None
    write_rank_error(folder, 3, ConfigError("--data", "second attempt's refusal"))
    write_rank_error(folder, 1, InfeasiblePlanError("rank 1 of the second attempt"))
    err = read_rank_error(folder)
    assert err is not None and "rank 1 of the second" in str(err) and err.exit_code == 3


@pytest.mark.timeout(60)
def test_torchrun_stays_quiet_when_a_rank_refused_and_not_otherwise(tmp_path):
    """Real torchrun, one rank that refuses (writes its error and exits 2): no traceback.
    The same failure without a refusal keeps torchrun's report."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import sys\nfrom autoplan.errors import ConfigError\n"
        "from autoplan.runtime.rank_errors import write_rank_error\n"
        "if sys.argv[1] == 'refuse':\n"
        f"    write_rank_error({str(tmp_path)!r}, 0, ConfigError('--x', 'bad'))\n"
        "sys.exit(2)\n")
    from autoplan.runtime.launch import torchrun_command

    def run(mode: str) -> subprocess.CompletedProcess:
        cmd = torchrun_command(1, 0, [], errors=str(tmp_path))
        cmd = cmd[:cmd.index("-m", 3)] + [str(script), mode]  # the script, not the worker
        return subprocess.run(cmd, capture_output=True, text=True, timeout=50,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})

    quiet = run("refuse")
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr, quiet.stderr
    assert "ChildFailedError" not in quiet.stderr and "failed (exitcode" not in quiet.stderr
    (tmp_path / "error.attempt0.rank0.json").unlink()
    loud = run("crash")
    assert loud.returncode != 0 and "ChildFailedError" in loud.stderr, loud.stderr


# -- 4. --pg-timeout-s floor -----------------------------------------------------------------

@pytest.mark.parametrize("value", ["0.001", "0.5"])
def test_a_pg_timeout_below_a_second_is_refused(capsys, no_launch, plan, value):
    assert_refused(capsys, ["train", plan, "--steps", "2", "--pg-timeout-s", value],
                   f"--pg-timeout-s: got {float(value)!r}", "at least 1 s")


# -- 5. a second Ctrl-C --------------------------------------------------------------------

def test_a_killed_run_says_whether_a_checkpoint_exists_and_the_last_step(tmp_path):
    from autoplan.runtime.launch import _interrupted
    from autoplan.runtime.supervise import Outcome
    from tests.dist.parity import TEST_MODELS
    from tests.unit.runtime.test_checkpoint_files import _save

    killed = Outcome(returncode=-9, signal=signal.SIGINT, killed=True)
    metrics = tmp_path / "m.jsonl"
    sink = MetricsSink(str(metrics), live=False)
    for step in (1, 2, 3):
        sink.record(StepMetrics(step, 5.0, 0.05, 1e4, 1 << 20, 0.5))
    (tmp_path / "ck").mkdir()
    args = argparse.Namespace(checkpoint_dir=str(tmp_path / "ck"), metrics_file=str(metrics))
    line = _interrupted(killed, None, args)
    assert "newest whole checkpoint" not in line, line
    assert f"no whole checkpoint in {tmp_path / 'ck'}: nothing to resume" in line, line
    assert "the last step recorded in --metrics-file was 3" in line, line
    _save(tmp_path / "ck" / "step-00000002", TEST_MODELS["h8-2l"], step=2)
    line = _interrupted(killed, None, args)
    assert "--resume continues from step-00000002 (step 2)" in line, line


# -- 6 and 7. the summary's note: another device, a diverged loss ---------------------------

def _history(losses, times=None) -> list[StepMetrics]:
    times = times or [0.05] * len(losses)
    return [StepMetrics(i + 1, loss, dt, 8192 / dt, 1 << 20, 0.5)
            for i, (loss, dt) in enumerate(zip(losses, times, strict=True))]


def test_a_device_mismatch_is_noted_and_its_ratios_not_given():
    from rich.console import Console

    mismatch = ("the plan's profile a100-sxm4-80gb describes a100, but this run trains on cpu "
                "(gloo): measured and predicted will differ")
    summary = summarize(_history([5.0, 4.9, 4.8]), make_plan(), device_mismatch=mismatch)
    assert mismatch in summary["note"]
    console = Console(record=True, width=200)
    render_summary(console, summary)
    text = console.export_text()
    assert text.count("not comparable") == 3, text
    plain = Console(record=True, width=200)
    render_summary(plain, summarize(_history([5.0, 4.9, 4.8]), make_plan()))
    assert "not comparable" not in plain.export_text()


def _strict_json(line: str):
    def bare(name):
        raise ValueError(f"bare {name} is not JSON")

    return json.loads(line, parse_constant=bare)


def test_a_diverged_run_writes_json_and_notes_the_first_nonfinite_step(tmp_path):
    path = tmp_path / "m.jsonl"
    sink = MetricsSink(str(path), live=False)
    for m in _history([5.0, math.nan, math.inf]):
        sink.record(m)
    rows = [_strict_json(line) for line in path.read_text().splitlines()]
    assert [r["loss"] for r in rows] == [5.0, None, None]
    assert metrics_file_problem(path) is None  # --resume still accepts the file
    summary = summarize(sink.history, make_plan())
    assert summary["final_loss"] is None
    assert "the loss is not finite from step 2 on" in summary["note"], summary["note"]
    json.dumps(summary, allow_nan=False)


def test_the_tokens_per_s_median_is_tokens_per_step_over_the_median_step_time():
    history = _history([5.0] * 5, times=[1.0, 0.1, 0.2, 0.4, 0.8])  # warm-up, then 4 steps
    measured = summarize(history, make_plan())["measured"]
    assert measured["step_time_s"] == pytest.approx(0.3)
    assert measured["tokens_per_s"] * measured["step_time_s"] == pytest.approx(8192)


# -- 8. --dropout on resume ------------------------------------------------------------------

def test_resume_with_another_dropout_names_the_flag_and_the_saved_rate(tmp_path, capsys,
                                                                       no_launch, plan):
    from tests.unit.runtime.test_checkpoint_compat import _save

    _save(tmp_path / "ck" / "step-00000005", step=5)
    err = assert_refused(capsys, ["train", plan, "--steps", "8", "--resume", "--checkpoint-dir",
                                  str(tmp_path / "ck"), "--dropout", "0.1"],
                         "--dropout: 0.1, but step-00000005 was saved with dropout 0.0",
                         "pass --dropout 0.0 to continue it")
    assert "model.dropout" not in err


# -- 9. step folders of any width ------------------------------------------------------------

def test_step_folders_past_eight_digits_are_found_and_sorted_by_number(tmp_path):
    from autoplan.runtime.checkpoint_files import complete_dirs

    for step in (99_999_999, 100_000_000, 7):
        (tmp_path / f"step-{step:08d}").mkdir()
    assert [p.name for p in complete_dirs(tmp_path)] == [
        "step-100000000", "step-99999999", "step-00000007"]


# -- 10. --data messages ---------------------------------------------------------------------

def test_the_data_size_bound_is_the_one_that_trains(tmp_path):
    short, enough = tmp_path / "short.bin", tmp_path / "enough.bin"
    short.write_bytes(b"x" * SEQ)
    enough.write_bytes(b"x" * (SEQ + 1))
    with pytest.raises(ConfigError, match=f"holds {SEQ} bytes; need at least {SEQ + 1}"):
        ByteText(short, SEQ)
    with pytest.raises(ConfigError, match=f"need at least {SEQ + 1}"):
        scan_corpus(short, SEQ)
    assert ByteText(enough, SEQ).num_windows == 1 and scan_corpus(enough, SEQ)["bytes"] == 33


def test_an_empty_data_folder_says_it_holds_no_files(tmp_path, capsys, no_launch, plan):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    err = assert_refused(capsys, ["train", plan, "--steps", "2", "--data",
                                  str(tmp_path / "empty")],
                         f"--data: the folder {str(tmp_path / 'empty')!r} holds no files",
                         "put text files in it")
    assert "pass a file or a directory" not in err
