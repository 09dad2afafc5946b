"""An output that cannot be written (a full disk) or whose reader went away (`| head`) ends the
command with one line or quietly, never a traceback."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("fmt", ["table", "json", "yaml"])
def test_a_closed_pipe_is_exit_141_in_every_format(fmt, buffered) -> None:
    """The reader is gone before the first write (`| head` at its earliest): rich's table
    console must not end the command with its own exit 1, nor the interpreter's last flush of
    buffered JSON with 120 and an 'Exception ignored' line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "cli.py"), "estimate", "--model",
                               "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2", "--format",
                               fmt], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120, cwd=ROOT, env=env)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_other_os_errors_are_bugs_and_keep_their_traceback(monkeypatch) -> None:
    def broken(args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(estimate_cli, "estimate_command", broken)
    with pytest.raises(PermissionError):
        commands.main(["estimate", "--model", "tiny"])
