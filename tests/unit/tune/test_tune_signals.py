"""A tune stopped by SIGTERM or SIGHUP kills its running trial (a child in a session of its
own, which never sees the signal), releases its --out lock and removes its temporary trial
directory, and exits 128 + the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoplan.tune.runner import Stopped, stop_on_signals
from tests.process_state import running

ROOT = Path(__file__).resolve().parents[3]
TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2", "--top", "1", "--steps", "3", "--trial-timeout-s", "120"]
# `autoplan tune` whose trial is a child that writes its pid, then hangs
SCRIPT = """
import sys
import autoplan.tune.runner as runner
from autoplan.commands import main

HANG = ("import os, sys, time\\n"
        "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\\n"
        "time.sleep(120)\\n")
runner.train_command = lambda *_: [sys.executable, "-c", HANG, sys.argv[1]]
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("with_out", [True, False])
def test_sigterm_kills_the_trial_and_leaves_no_lock_or_workdir(tmp_path: Path,
                                                                with_out: bool) -> None:
    pidfile, temp, out = tmp_path / "child.pid", tmp_path / "tmp", tmp_path / "out"
    temp.mkdir()
    argv = [*TUNE, "--out", str(out)] if with_out else TUNE
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(pidfile), *argv], cwd=ROOT,
                            env={**os.environ, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the trial never started"
            time.sleep(0.1)
        child = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert "stopped by SIGTERM" in err and len(err.strip().splitlines()) <= 3, err
        assert not running(child)
        assert not list(tmp_path.rglob("*.lock"))
        assert list(temp.iterdir()) == []  # the temporary trial directory is gone
        if with_out:  # no result files: the tune did not finish
            assert not (out / "summary.json").exists() and not (out / "plan.yaml").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)


def test_stop_on_signals_raises_once_and_restores_the_handlers() -> None:
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(Stopped) as caught, stop_on_signals():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)  # the handler raises before this ends
    assert caught.value.signum == signal.SIGHUP and str(caught.value) == "SIGHUP"
    assert signal.getsignal(signal.SIGHUP) == before
