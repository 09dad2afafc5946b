"""A mistyped flag is refused in one line that names the sub-command's help and the flag it likely
misspells (autoplan.commands._Parser), and no flag is taken abbreviated: `train --step 5` once
started a real run as --steps."""

from __future__ import annotations

import argparse

import pytest

from autoplan.commands import build_parser, main


def _refused(capsys, argv: list[str]) -> str:
    """The one line of stderr of an argparse refusal (exit 2)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err.rstrip("\n")


ESTIMATE = ["estimate", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1"]
SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
          "--global-batch-size", "2"]


@pytest.mark.parametrize("argv, says", [
    ([*ESTIMATE, "--globl-batch-size", "64"],
     "autoplan estimate: error: unrecognized arguments: --globl-batch-size 64; did you mean "
     "--global-batch-size?; see 'autoplan estimate --help'"),
    ([*SEARCH, "--objetive", "cost"],
     "autoplan search: error: unrecognized arguments: --objetive cost; did you mean "
     "--objective?; see 'autoplan search --help'"),
    ([*SEARCH, "--objetive=cost"],
     "autoplan search: error: unrecognized arguments: --objetive=cost; did you mean "
     "--objective?; see 'autoplan search --help'"),
    (["train", "plan.yaml", "--step", "5"],
     "autoplan train: error: unrecognized arguments: --step 5; did you mean --steps?; "
     "see 'autoplan train --help'"),
    ([*ESTIMATE, "--batch-size", "8"],  # two equally close: both named
     "autoplan estimate: error: unrecognized arguments: --batch-size 8; did you mean "
     "--micro-batch-size or --global-batch-size?; see 'autoplan estimate --help'"),
    ([*SEARCH, "--objetive", "cost", "--tpo", "3"],  # several: each named with its flag
     "autoplan search: error: unrecognized arguments: --objetive cost --tpo 3; --objetive: did "
     "you mean --objective?; --tpo: did you mean --top?; see 'autoplan search --help'"),
    ([*ESTIMATE, "--zzzz"],  # nothing close: no guess
     "autoplan estimate: error: unrecognized arguments: --zzzz; see 'autoplan estimate --help'"),
    (["--verbos", *ESTIMATE],  # the top parser's own flag, before the sub-command
     "autoplan: error: unrecognized arguments: --verbos; did you mean --verbose?; "
     "see 'autoplan --help'"),
])
def test_an_unknown_flag_names_the_closest_and_the_sub_command_s_help(capsys, argv, says) -> None:
    assert _refused(capsys, argv) == says


def test_a_misspelt_required_flag_is_named_beside_the_missing_one(capsys) -> None:
    """argparse reports the missing flag first; the misspelling that left it missing is the fix."""
    argv = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
            "--globl-batch-size", "2"]
    assert _refused(capsys, argv) == (
        "autoplan search: error: the following arguments are required: --global-batch-size; "
        "unrecognized arguments: --globl-batch-size; did you mean --global-batch-size?; "
        "see 'autoplan search --help'")


def test_an_unknown_argument_with_a_line_break_stays_on_one_line(capsys) -> None:
    line = _refused(capsys, [*ESTIMATE, "--x\ny"])
    assert "--x\\ny" in line


def _commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _cut_flags() -> list[tuple[str, str]]:
    """(command, flag) for every long flag whose name cut by one letter is no flag of its own."""
    cases = []
    for name, parser in _commands().items():
        flags = {o for a in parser._actions for o in a.option_strings}
        cases += [(name, flag) for flag in sorted(flags)
                  if flag.startswith("--") and len(flag) > 5 and flag[:-1] not in flags]
    return cases


@pytest.mark.parametrize("command, flag", _cut_flags())
def test_no_flag_is_taken_abbreviated(capsys, monkeypatch, tmp_path, command, flag) -> None:
    """Each sub-command's every flag cut short is refused, and the whole flag suggested."""
    monkeypatch.chdir(tmp_path)  # taken as the flag, `tune --dry-ru` would run here
    line = _refused(capsys, [command, flag[:-1]])
    assert f"unrecognized arguments: {flag[:-1]}" in line
    hint = line.split("did you mean ", 1)[1].split("?", 1)[0]
    assert flag in hint.split(" or ")
    assert line.endswith(f"; see 'autoplan {command} --help'")


def test_the_cut_flags_cover_every_sub_command() -> None:
    assert {command for command, _ in _cut_flags()} == set(_commands()) and len(_cut_flags()) > 100
