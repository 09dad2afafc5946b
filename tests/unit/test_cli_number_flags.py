"""Every number flag of train, tune, profile and calibrate reads numbers as search and estimate
do (cli_common's count/amount/duration: `--steps 10k`, `--pg-timeout-s 10min`, tune's
`--seq-len 8k`; no suffix on a rate or ratio: `--lr 1k` is refused) and refuses a bad value in
the house line, `autoplan X: error: --flag: got ...`, without argparse's `argument ` prefix."""

from __future__ import annotations

import argparse

import pytest

from autoplan.commands import build_parser, main
from autoplan.plan_files import save_plan
from autoplan.runtime.cli import add_train_arguments
from autoplan.runtime.launch import worker_argv
from tests.dist.parity import make_plan

TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2"]


def _refused(capsys, argv: list[str]) -> str:
    """The one stderr line of an argparse refusal (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and not captured.out, err
    assert "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--steps", "ten", "--steps: got 'ten'; write a whole number, e.g. 20 or 10k"),
    ("--steps", "1.5x", "--steps: got '1.5x'"),
    ("--checkpoint-every", "1.0005k", "--checkpoint-every: got '1.0005k'"),  # 1000.5
    ("--keep-checkpoints", "3k", "--keep-checkpoints: got '3k'; write a whole number, e.g. 3"),
    ("--max-restarts", "1.5", "--max-restarts: got '1.5'; write a whole number, e.g. 3"),
    ("--nproc", "two", "--nproc: got 'two'; write a whole number, e.g. 8"),
    ("--min-gpus", "8x", "--min-gpus: got '8x'"),
    ("--seed", "x", "--seed: got 'x'; write a whole number, e.g. 0"),
    ("--lr", "1k", "--lr: got '1k'; write a number, e.g. 1e-3"),
    ("--lr", "nan", "--lr: got 'nan'; write a number, e.g. 1e-3"),
    ("--lr", "1e999", "--lr: got '1e999'"),
    ("--max-grad-norm", "inf", "--max-grad-norm: got 'inf'; write a number, e.g. 1.0"),
    ("--dropout", "10%", "--dropout: got '10%'; write a number, e.g. 0.1"),
    ("--pg-timeout-s", "5m", "--pg-timeout-s: got '5m': minutes or months?"),
    ("--pg-timeout-s", "soon", "--pg-timeout-s: got 'soon'; write a number of seconds"),
])
def test_train_refuses_a_bad_number_in_the_house_line(capsys, flag: str, value: str,
                                                      needle: str) -> None:
    err = _refused(capsys, ["train", "plan.yaml", flag, value])
    assert err.startswith(f"autoplan train: error: {needle}"), err


def test_train_reads_suffixes_where_they_make_sense() -> None:
    args = build_parser().parse_args([
        "train", "plan.yaml", "--steps", "10k", "--checkpoint-every", "0.5k",
        "--min-gpus", "1k", "--pg-timeout-s", "10min", "--lr", "3e-4", "--dropout", "0",
        "--max-grad-norm", "1"])
    assert (args.steps, args.checkpoint_every, args.min_gpus) == (10_000, 500, 1024)
    assert (args.pg_timeout_s, args.lr, args.dropout, args.max_grad_norm) == (600.0, 3e-4,
                                                                               0.0, 1.0)


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--lr", "0", "--lr: got 0.0; expected a positive finite learning rate, e.g. 1e-3"),
    ("--dropout", "1", "--dropout: got 1.0; expected a probability in [0, 1)"),
    ("--pg-timeout-s", "500ms", "--pg-timeout-s: got 0.5; expected seconds in [1, 604800]"),
    ("--steps", "0", "--steps: got 0; expected at least 1"),
    ("--max-restarts", "-1", "--max-restarts: got -1; expected 0 or more"),
])
def test_train_keeps_its_range_checks_and_their_messages(tmp_path, capsys, flag: str,
                                                         value: str, needle: str) -> None:
    plan = save_plan(make_plan(dp=2), tmp_path / "plan.yaml")
    assert main(["train", str(plan), "--steps", "2", flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_the_workers_read_back_the_values_the_launcher_passes(tmp_path) -> None:
    """The launcher writes floats with repr (1e-05, 0.0) for ranks that parse them with the
    same flag types: each must come back as it went."""
    args = build_parser().parse_args([
        "train", "plan.yaml", "--steps", "1k", "--lr", "0.00001", "--dropout", "0",
        "--max-grad-norm", "0.5", "--pg-timeout-s", "2min", "--seed", "7",
        "--checkpoint-every", "250"])
    worker = argparse.ArgumentParser(allow_abbrev=False)
    add_train_arguments(worker)
    again = worker.parse_args(worker_argv(args, str(tmp_path / "summary.json")))
    for name in ("steps", "lr", "dropout", "max_grad_norm", "pg_timeout_s", "seed",
                 "checkpoint_every", "keep_checkpoints"):
        assert getattr(again, name) == getattr(args, name), name
    assert again.launcher_pid > 0


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--seq-len", "8kk", "--seq-len: got '8kk'; write a whole number, e.g. 8192 or 8k"),
    ("--top", "ten", "--top: got 'ten'; write a whole number, e.g. 8"),
    ("--steps", "many", "--steps: got 'many'; write a whole number, e.g. 8"),
    ("--budget-s", "100m", "--budget-s: got '100m': minutes or months?"),
    ("--trial-timeout-s", "3 minutes", "--trial-timeout-s: got '3 minutes'; write a number of "
                                       "seconds"),
    ("--prune-ratio", "1.5x", "--prune-ratio: got '1.5x'; write a number, e.g. 1.5"),
    ("--num-gpus", "one", "--num-gpus: got 'one'; write a whole number, e.g. 8"),
])
def test_tune_refuses_a_bad_number_in_the_house_line(capsys, flag: str, value: str,
                                                     needle: str) -> None:
    err = _refused(capsys, [*TUNE, flag, value, "--dry-run"])
    assert err.startswith(f"autoplan tune: error: {needle}"), err


def test_tune_reads_a_sequence_length_and_times_as_search_does() -> None:
    args = build_parser().parse_args([*TUNE, "--seq-len", "0.125k", "--budget-s", "1h",
                                      "--trial-timeout-s", "3min", "--top", "4"])
    assert (args.seq_len, args.budget_s, args.trial_timeout_s, args.top) == (128, 3600.0,
                                                                             180.0, 4)


def test_tune_keeps_its_own_range_message(capsys) -> None:
    assert main([*TUNE, "--top", "0", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("autoplan tune: error: --top: got 0; expected a positive integer"), err


@pytest.mark.parametrize(("argv", "needle"), [
    (["profile", "--ranks", "four"], "autoplan profile: error: --ranks: got 'four'; write a "
                                     "whole number, e.g. 4"),
    (["calibrate", "run.json", "--profile", "cpu-gloo", "--seed", "x"],
     "autoplan calibrate: error: --seed: got 'x'; write a whole number, e.g. 0"),
])
def test_profile_and_calibrate_refuse_in_the_house_line(capsys, argv: list[str],
                                                        needle: str) -> None:
    assert _refused(capsys, argv).startswith(needle)


@pytest.mark.parametrize("argv", [
    ["search", "--model", "tiny", "--format", "xml"],
    ["train", "plan.yaml", "--optimizer", "lion"],
    ["estimate", "--seq-len"],
])
def test_an_argparse_refusal_starts_with_the_flag(capsys, argv: list[str]) -> None:
    """argparse's own refusals (a bad choice, a missing value) lose its `argument ` prefix
    too: the line reads as a ConfigError's does, flag first."""
    err = _refused(capsys, argv)
    flag = next(a for a in reversed(argv) if a.startswith("--"))
    assert f"error: {flag}: " in err and "argument " not in err, err


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        else:
            yield action


def test_no_flag_is_left_with_a_bare_int_or_float() -> None:
    """int and float read '８', '1_000' and 'nan' and refuse in argparse's words ('invalid int
    value'): every number flag takes a cli_common parser instead."""
    bare = sorted({"/".join(a.option_strings) for a in _actions(build_parser())
                   if a.type in (int, float)})
    assert bare == []
