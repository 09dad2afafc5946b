"""Flags that build a plan (autoplan/plan_args.py): an out-of-range value is refused as the flag
the user gave."""

from __future__ import annotations

import pytest

from autoplan.commands import main


@pytest.mark.parametrize("command", ["estimate", "search", "tune"])
def test_a_seq_len_past_the_limit_names_the_flag(capsys, command) -> None:
    """--seq-len 99999999 was refused as `model.seq_len`, a field the user never wrote."""
    argv = [command, "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
            "--global-batch-size", "1", "--seq-len", "99999999"]
    assert main(argv + (["--dry-run"] if command == "tune" else [])) == 2
    err = capsys.readouterr().err
    assert f"autoplan {command}: error: --seq-len: got 99999999; expected a positive integer " \
           "up to 16,777,216" in err, err
