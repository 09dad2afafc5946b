"""Progress in every mode (issue #16 item 5): a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from autoplan.progress import tracker

ROOT = Path(__file__).resolve().parents[2]


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=False)
    with tracker("search", console, stream=out, every=0.0) as t:
        t("trials", 1, 4)
        t("trials", 2, 4)
        t.add_task("measuring", total=3)
        t.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("search: trials 1/4 (25%)")
    assert lines[1].startswith("search: trials 2/4 (50%)")
    assert any(line.startswith("search: measuring 3/3 (100%)") for line in lines)
    assert lines[-1].startswith("search: done in")


def test_quick_work_prints_nothing_between_lines() -> None:
    out = io.StringIO()
    with tracker("profile", Console(file=io.StringIO()), stream=out, every=3600.0) as t:
        for k in range(100):
            t("step", k, 100)
    assert out.getvalue() == ""


def test_a_bar_on_a_terminal() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with tracker("profile", console) as t:
        assert t.bar is not None
        t.add_task("GEMMs", total=2)
        t.advance()
        t.bar.refresh()
    assert "profile: GEMMs" in screen.getvalue()


def test_a_tpe_search_reports_progress_on_a_pipe() -> None:
    env = {**os.environ, "AUTOPLAN_PROGRESS_EVERY_S": "0"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "search", "--model", "tiny", "--cluster",
         "cpu-gloo", "--num-gpus", "4", "--global-batch-size", "16", "--sampler", "tpe",
         "--trials", "12", "--format", "json"],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("search: trials")]
    assert len(lines) >= 2 and "/12" in lines[-1]
    assert "search: done in" in proc.stderr
