"""The terminal table on 80 columns never cuts the column the search optimises: less important
columns go first, and what must still give way is another column, never the objective's."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.search.engine import SearchRequest, run_search
from autoplan.search.output import summary
from autoplan.search.render import render
from autoplan.search.rows import Shown, collapse, shown_rows
from autoplan.search.table import COLUMNS, ranked_table
from autoplan.search.targets import Targets
from autoplan.search_space import load_space

CELLS = {c[0]: c[4] for c in COLUMNS}
OBJECTIVE_KEY = {"cost": "usd", "throughput": "tokens", "latency": "step", "gpus": "num_gpus"}


def printed(renderable: Any) -> str:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def whole(text: str, cell: str) -> bool:
    """`cell` printed in full, as a word of its own."""
    return re.search(rf"(^|\s){re.escape(cell)}(\s|$)", text, re.MULTILINE) is not None


def row(k: int) -> dict[str, Any]:
    """Plan k of ten that differ in every knob that has a column: the widest narrow table."""
    two = k % 2
    return {
        "cluster": ("a100-sxm4-80gb", "h100-sxm-80gb")[two], "num_gpus": (64, 128)[two],
        "gbs": (512, 1024)[two], "dp": (32, 16, 8, 4)[k % 4], "dp_shard": 4 * two,
        "tp": (1, 2, 4, 8)[k % 4], "pp": 2, "cp": 1, "ep": 1 + two, "etp": 1 + two,
        "sp": bool(two), "schedule": "interleaved-1f1b", "vpp": 1 + k % 3, "split": "balanced",
        "zero": k % 4, "offload_optimizer": bool(two), "offload_params": bool(two),
        "recompute": ("none", "selective", "full")[k % 3], "recompute_layers": 12,
        "mbs": 1 + two, "precision": "bf16", "grad_reduce": ("", "fp32")[two],
        "attention": ("flash", "eager")[two], "mem_gib": 71.3 + k, "step_s": 6.13 + k / 100,
        "band": 0.11, "tokens_per_s": 171_234.0 - 100 * k, "mfu": 0.531,
        "dominant": ("compute", "tp_comm")[two], "days": 20.3, "gpu_hours": 31_189.0 + 10 * k,
        "usd": 35_212.0 + 37 * k}


@pytest.mark.parametrize("objective", sorted(OBJECTIVE_KEY))
def test_the_objective_column_stays_whole_however_wide_the_rest(objective: str) -> None:
    shown: list[Shown] = collapse([row(k) for k in range(10)], 10)
    table, _, dropped = ranked_table(shown, "t", [objective], width=80, one_count=False,
                                     one_batch=False)
    text = printed(table)
    key = OBJECTIVE_KEY[objective]
    assert key not in dropped
    for s in shown:
        assert whole(text, CELLS[key](s, False)), (objective, CELLS[key](s, False), text)


def test_cost_on_80_columns_leaves_figures_out_before_cutting_dollars(monkeypatch) -> None:
    """The recorded case: `--objective cost` read `35,2...` in the USD column."""
    monkeypatch.setenv("COLUMNS", "80")
    req = SearchRequest(load_model("gpt3-13b"), "gpt3-13b", load_profile("a100-sxm4-80gb"),
                        "a100-sxm4-80gb", load_space("default"), (64,), 512,
                        Targets(("cost",), train_tokens=300e9))
    result = run_search(req)
    data = summary(result, 10)
    console = Console(width=80, record=True, file=io.StringIO())
    render(console, result, data, 10)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    assert re.search(r"\sUSD\s*$", text, re.MULTILINE)
    for s in shown_rows(result, data, 10):
        assert whole(text, f"{s.row['usd']:,.0f}"), (s.rank, s.row["usd"])
    assert "--wide adds: MFU" in " ".join(text.split())
