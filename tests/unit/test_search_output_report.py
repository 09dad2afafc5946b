"""report.html's ranked table holds the plans summary.json keeps, in their order, as the terminal
table shows them: never a plan ranked below --top."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.search.engine import SearchRequest, SearchResult, run_search
from autoplan.search.output import summary
from autoplan.search.report import ranked_html, shown_plans
from autoplan.search.rows import dp_cell, shown_rows
from autoplan.search_space import load_space

TOP = 10


@pytest.fixture(scope="module")
def result() -> SearchResult:
    # tiny on 4 CPU ranks: ZeRO stages at dp 1 score alike, so equivalent plans share a row
    return run_search(SearchRequest(load_model("tiny"), "tiny", load_profile("cpu-gloo"),
                                    "cpu-gloo", load_space("default"), (4,), 16))


def table_rows(table: str) -> list[dict[str, str]]:
    """The rows of one table_html table, each as {header: cell}."""
    rows = [[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r)]
            for r in re.findall(r"<tr[^>]*>(.*?)</tr>", table)]
    return [dict(zip(rows[0], r, strict=True)) for r in rows[1:]]


def test_the_report_ranks_the_plans_summary_json_keeps(result: SearchResult) -> None:
    data: dict[str, Any] = summary(result, TOP)
    top = data["top"]
    shown, rows = shown_plans(result, TOP)
    page_rows = table_rows(ranked_html(result, shown))
    ranks = [int(r["#"]) for r in page_rows]
    assert len(top) == TOP and len(ranks) < TOP  # equivalent plans merged: the case at issue
    assert ranks == [s.rank for s in shown_rows(result, data, TOP)]  # the terminal's rows
    assert ranks == sorted(ranks) and ranks[0] == 1 and ranks[-1] <= len(top)
    for cells, rank in zip(page_rows, ranks, strict=True):  # summary.json's plan of that rank
        plan = top[rank - 1]
        assert cells["dp"] == dp_cell(plan)
        for key in ("tp", "pp", "mbs"):
            assert cells.get(key, str(plan[key])) == str(plan[key]), (rank, key)
    assert [int(result.scored.cols["tp"][i]) for i in rows] == [top[k - 1]["tp"] for k in ranks]


def test_the_report_says_what_its_rows_fold_as_the_terminal_does(
        result: SearchResult, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recompute variants folded into a row are named under the report's table in the
    terminal's words (notes.fold_note), not shown as rows of their own."""
    from io import StringIO

    from rich.console import Console

    from autoplan.search import render as terminal
    from autoplan.search.report import _pyplot, page

    data: dict[str, Any] = summary(result, TOP)
    shown = shown_rows(result, data, TOP)
    folded = [k for s in shown for k, _ in s.folded]
    assert folded  # the case at issue: some ranked plan is a slower recompute variant
    out = StringIO()
    monkeypatch.setattr(terminal, "terminal_width", lambda: 10_000)  # each line unwrapped
    terminal.render(Console(file=out), result, data, TOP)
    note = next(line for line in out.getvalue().splitlines()
                if line.startswith("slower recompute variants share their plan's row"))
    text = page(result, TOP, _pyplot())
    assert f"<p class=note>{html.escape(note)}</p>" in text
    page_ranks = {int(r["#"]) for r in table_rows(re.findall(r"<table>.*?</table>", text)[1])}
    assert page_ranks == {s.rank for s in shown} and not page_ranks & set(folded)
