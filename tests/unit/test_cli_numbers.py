"""Number flags take the suffixes people write (user test 37, finding 2): `--seq-len 8k` is
8192 (binary: lengths are powers of two), `--train-tokens 1T` is 1e12 (decimal: budgets),
`--deadline-days 2w` is 14 days; a bad value is one line naming the value and what to write,
not argparse's "invalid float value"."""

from __future__ import annotations

import argparse
import json

import pytest

from autoplan.cli_common import amount, count, duration, scaled_count, scaled_number
from autoplan.commands import main

TINY = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
        "--global-batch-size", "16", "--space", "small-cpu", "--format", "json"]


@pytest.mark.parametrize(("text", "binary", "value"), [
    ("8k", True, 8192), ("8K", True, 8192), ("128k", True, 131072), ("1.5k", True, 1536),
    ("1M", True, 2**20), ("1T", False, 10**12), ("1.5t", False, 1.5e12), ("300B", False, 3e11),
    ("300G", False, 3e11), ("250k", False, 250_000), ("1e12", False, 1e12), ("4096", True, 4096),
    (" 64 ", True, 64), ("99999999999999999999", True, 99999999999999999999),
])
def test_suffixes_scale_by_1024_or_1000(text: str, binary: bool, value: float) -> None:
    assert scaled_number(text, binary=binary) == value


@pytest.mark.parametrize("text", ["8x", "k", "1Tx", "nan", "inf", "1e999", "1_000", "８",
                                  "1..2", "", "0x10", "8 k"])
def test_what_is_no_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        scaled_number(text, binary=False)


def test_a_count_must_come_out_whole() -> None:
    assert scaled_count("1.5k", binary=True) == 1536
    with pytest.raises(ValueError):
        scaled_count("8.1k", binary=True)  # 8294.4


@pytest.mark.parametrize(("unit", "text", "value"), [
    ("days", "7", 7.0), ("days", "2w", 14.0), ("days", "36h", 1.5), ("days", "1.5d", 1.5),
    ("s", "2.5", 2.5), ("s", "100ms", 0.1), ("s", "2min", 120.0), ("s", "5 s", 5.0),
])
def test_durations_take_units_and_give_the_flags_own(unit: str, text: str,
                                                      value: float) -> None:
    assert duration(unit, "7")(text) == pytest.approx(value)


@pytest.mark.parametrize(("parse", "text", "needle"), [
    (duration("s", "30"), "100m", "minutes or months?; write min for minutes"),
    (duration("s", "30"), "5 fortnights", "write a number of seconds, e.g. 30, or one with a unit"),
    (duration("days", "7"), "-1", "expected a positive time"),
    (duration("days", "7"), "nan", "write a number of days"),
    (amount("tokens", "1e12 or 1T"), "1Tx", "got '1Tx'; write a number of tokens, e.g. 1e12 or 1T"),
    (amount("tokens", "1e12 or 1T"), "0", "expected a positive number of tokens"),
    (count(suffixes="binary", example="8192 or 8k"), "8.1k", "write a whole number, e.g. 8192"),
    (count(example="10"), "ten", "got 'ten'; write a whole number, e.g. 10"),
])
def test_a_bad_value_names_itself_and_the_fix(parse, text: str, needle: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)
    assert needle in str(err.value)


def _refused(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert "invalid" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--seq-len", "8kk", "--seq-len: got '8kk'; write a whole number, e.g. 8192 or 8k"),
    ("--train-tokens", "1Tx", "--train-tokens: got '1Tx'; write a number of tokens"),
    ("--deadline-days", "2 weeks", "--deadline-days: got '2 weeks'; write a number of days"),
    ("--max-step-time-s", "100m", "--max-step-time-s: got '100m': minutes or months?"),
    ("--min-tokens-per-s", "fast", "--min-tokens-per-s: got 'fast'; write a number of tokens/s"),
    ("--seed", "x", "--seed: got 'x'; write a whole number"),
    ("--top", "ten", "--top: got 'ten'; write a whole number, e.g. 10"),
])
def test_search_refuses_each_number_flag_in_one_line(capsys, flag: str, value: str,
                                                     needle: str) -> None:
    assert needle in _refused(capsys, [*TINY, flag, value])


@pytest.mark.parametrize(("flag", "value", "needle"), [
    ("--seq-len", "64x", "--seq-len: got '64x'"),
    ("--train-tokens", "lots", "--train-tokens: got 'lots'; write a number of tokens"),
    ("--num-gpus", "four", "--num-gpus: got 'four'; write a whole number, e.g. 64"),
    ("--global-batch-size", "16.5", "--global-batch-size: got '16.5'"),
])
def test_estimate_refuses_each_number_flag_in_one_line(capsys, flag: str, value: str,
                                                       needle: str) -> None:
    argv = ["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
            "--format", "json", flag, value]
    assert needle in _refused(capsys, argv)


def test_search_reads_suffixed_values_as_the_numbers_they_name(capsys) -> None:
    argv = [*TINY[:-2], "--seq-len", "0.125k", "--train-tokens", "1M",
            "--deadline-days", "2w", "--max-step-time-s", "1min", "--format", "json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best"]["model"]["seq_len"] == 128  # 0.125 x 1024
    assert {k: data["targets"][k] for k in ("train_tokens", "deadline_days", "max_step_time_s")
            } == {"train_tokens": 1e6, "deadline_days": 14.0, "max_step_time_s": 60.0}


def test_estimate_reads_a_suffixed_sequence_length_and_budget(capsys) -> None:
    argv = ["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
            "--seq-len", "0.125k", "--train-tokens", "1M", "--format", "json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["model"]["seq_len"] == 128
    assert data["days_to_train"] == pytest.approx(1e6 / data["tokens_per_s"] / 86400, rel=1e-6)


def test_review_a_edge_cases_read_one_way() -> None:
    """Review A (session 37): an exponent with a suffix (1e3k) is two scales, refused; a flag
    without suffixes says so for 1k; duration units take any case as count suffixes do, and M
    stays ambiguous (minutes or months)."""
    with pytest.raises(argparse.ArgumentTypeError, match="1e3k"):
        count(suffixes="binary")("1e3k")
    with pytest.raises(argparse.ArgumentTypeError, match="a plain number here: no k, M, G suffix"):
        count(example="1")("1k")
    assert duration("days", "7")("36H") == pytest.approx(1.5)
    assert duration("s", "100")("100MS") == pytest.approx(0.1)
    with pytest.raises(argparse.ArgumentTypeError, match="minutes or months"):
        duration("days", "7")("2M")
    assert count(suffixes="binary")("1B") == 2**30  # B as G, as the help now says
