"""The "why this plan" line compares the winner with the next different layout among every
ranked plan, not only the --top shown, and the terminal and --report say the same thing (the
report wrote "Only one layout is feasible." where thousands were, past --top 3)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.search.baseline import LAYOUT, next_layout
from autoplan.search.engine import run_search

from .conftest import request

pytest.importorskip("matplotlib")

# Every plan of the first 50 is dp 16 (ZeRO, recompute and micro-batch variants of one layout)
GPT3 = {"model": "gpt3-1.3b", "cluster": "a100-sxm4-80gb", "gpus": (16,), "gbs": 256}
GPT3_ARGS = ["search", "--model", "gpt3-1.3b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "16",
             "--global-batch-size", "256", "--format", "table"]
TINY_ONE_GPU = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
                "--global-batch-size", "16", "--space", "small-cpu", "--format", "table"]


def words(text: str) -> str:
    return " ".join(text.split())


def why_in_report(folder: Path) -> list[str]:
    page = (folder / "report.html").read_text(encoding="utf-8")
    section = page.split("<h2>Why this plan</h2>", 1)[1].split("<h2>", 1)[0]
    return [words(html.unescape(p)) for p in re.findall(r"<p>(.*?)</p>", section)]


@pytest.fixture(scope="module")
def gpt3():
    return run_search(request("default", **GPT3))


def test_the_next_layout_is_the_first_ranked_plan_of_another_layout(gpt3) -> None:
    found = next_layout(gpt3)
    assert found is not None
    rank, row = found
    c, order = gpt3.scored.cols, gpt3.order
    assert rank > 3 and order[rank - 1] == row  # past --top 3: the case the report got wrong
    winner = tuple(int(c[k][order[0]]) for k in LAYOUT)
    assert tuple(int(c[k][row]) for k in LAYOUT) != winner
    assert all(tuple(int(c[k][i]) for k in LAYOUT) == winner for i in order[:rank - 1])


def test_terminal_and_report_agree_past_the_top(gpt3, capsys, tmp_path: Path) -> None:
    rank, _ = next_layout(gpt3) or (0, 0)
    assert main([*GPT3_ARGS, "--top", "3", "--report", str(tmp_path / "rep")]) == 0
    out = words(capsys.readouterr().out)
    assert f"why this plan: against the next different layout (#{rank}, " in out
    lines = why_in_report(tmp_path / "rep")
    assert lines and all(line in out for line in lines)
    assert "Only one layout" not in (tmp_path / "rep" / "report.html").read_text()


def test_one_layout_is_said_as_it_is_in_both(capsys, tmp_path: Path) -> None:
    assert main([*TINY_ONE_GPU, "--report", str(tmp_path / "rep")]) == 0
    out = words(capsys.readouterr().out)
    assert "why this plan: the only feasible layout found (dp1 tp1 pp1;" in out
    assert "next different layout" not in out
    assert why_in_report(tmp_path / "rep")[0] in out


def test_a_cost_ranking_makes_no_claim_about_layouts(capsys, tmp_path: Path) -> None:
    """why_lines explains a throughput or latency ranking only; the report claimed a single
    feasible layout whenever it gave none."""
    argv = [*TINY_ONE_GPU[:6], "4", *TINY_ONE_GPU[7:], "--objective", "cost", "--report",
            str(tmp_path / "rep")]  # on 4 GPUs: several layouts
    assert main(argv) == 0
    assert "why this plan" not in capsys.readouterr().out
    page = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    assert "Why this plan" not in page and "Only one layout" not in page
