"""An output that cannot be written (a full disk) or whose reader went away (`| head`) ends the
command with one line or quietly, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoplan import commands, estimate_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_a_full_output_is_one_line_and_exit_1() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "estimate", "--model",
                               "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2"],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                              cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "autoplan estimate: error: cannot write the output (No space left on device); free "
        "space or write it elsewhere"]


def test_a_reader_that_went_away_ends_quietly(monkeypatch, capsys) -> None:
    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(estimate_cli, "estimate_command", closed_pipe)
    assert commands.main(["estimate", "--model", "tiny"]) == 141
    assert capsys.readouterr().err == ""


def test_other_os_errors_are_bugs_and_keep_their_traceback(monkeypatch) -> None:
    def broken(args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(estimate_cli, "estimate_command", broken)
    with pytest.raises(PermissionError):
        commands.main(["estimate", "--model", "tiny"])
