"""The search table's layout: its columns, the ones that move to the shared line or are left
out for the terminal's width (never the objective's), the legend of its abbreviations and the
table of candidates by outcome. The cells are rows.py's; the lines under the table notes.py's."""

from __future__ import annotations

import math
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from autoplan.display import whole
from autoplan.search.rows import (
    DOMINANT_SHORT,
    KNOBS,
    SHORT,
    SPLIT_LEGEND,
    SPLIT_SHORT,
    Shown,
    above_validated,
    days_cell,
    dp_cell,
    mem_cell,
    mfu_cell,
    offload_cell,
    precision_cell,
    recompute_cell,
    sched_cell,
    step_cell,
    tokens_cell,
    usd_cell,
    zero_cell,
)

# (key, wide header, narrow header, right-aligned, cell)
Cell = tuple[str, str, str, bool, Any]
COLUMNS: list[Cell] = [
    ("cluster", "gpu type", "type", False, lambda s, w: str(s.row.get("cluster", ""))),
    ("num_gpus", "gpus", "gpus", True, lambda s, w: str(s.row["num_gpus"])),
    ("rank", "#", "#", True, lambda s, w: str(s.rank)),
    ("dp", "dp", "dp", True, lambda s, w: dp_cell(s.row)),
    ("tp", "tp", "tp", True, lambda s, w: str(s.row["tp"])),
    ("pp", "pp", "pp", True, lambda s, w: str(s.row["pp"])),
    ("cp", "cp", "cp", True, lambda s, w: str(s.row["cp"])),
    ("ep", "ep", "ep", True, lambda s, w: str(s.row.get("ep", 1))),
    ("etp", "etp", "etp", True, lambda s, w: str(s.row.get("etp", 1))),
    ("sp", "sp", "sp", True, lambda s, w: ("yes" if w else "y") if s.row["sp"] else "-"),
    ("schedule", "schedule", "sched", False, lambda s, w: sched_cell(s.row, s.splits)),
    ("zero", "zero", "zero", True, lambda s, w: zero_cell(s)),
    ("offload", "offload", "off", False, lambda s, w: offload_cell(s.row, w, s.optimizers)),
    ("recompute", "recompute", "rc", False, lambda s, w: recompute_cell(s.row, w)),
    ("gbs", "global batch", "gbs", True, lambda s, w: str(s.row.get("gbs", ""))),
    ("mbs", "mbs", "mbs", True, lambda s, w: str(s.row["mbs"])),
    ("precision", "precision", "prec", False, lambda s, w: precision_cell(s.row)),
    ("attention", "attention", "attn", False, lambda s, w: s.row["attention"]),
    ("mem", "mem GiB", "GiB", True, lambda s, w: mem_cell(s.row)),
    ("step", "step s", "step s", True, lambda s, w: step_cell(s.row)),
    ("tokens", "tokens/s", "tok/s", True, lambda s, w: tokens_cell(s.row["tokens_per_s"], w)),
    ("mfu", "MFU", "MFU", True, lambda s, w: mfu_cell(s.row)),
    ("dominant", "dominant", "biggest", False,
     lambda s, w: s.row["dominant"] if w else DOMINANT_SHORT.get(s.row["dominant"],
                                                                  s.row["dominant"])),
    ("days", "days", "days", True, lambda s, w: days_cell(s.row)),
    ("gpu_hours", "GPU-h", "GPU-h", True, lambda s, w: whole(s.row["gpu_hours"])),
    ("usd", "USD", "USD", True, lambda s, w: usd_cell(s.row)),
]
HOISTABLE = ("cluster", "num_gpus", "gbs", "sp", "schedule", "zero", "offload", "recompute", "mbs",
             "precision", "attention", "cp", "ep", "etp", "dominant")
"""Columns that move to the "all rows" line when every shown row has the same cell."""
SHARED_NAMES = {"cluster": "GPU type", "num_gpus": "GPUs", "gbs": "global batch",
                "sp": "sequence parallel", "zero": "ZeRO", "mbs": "micro-batch",
                "dominant": "biggest cost"}
EXPERT_KNOBS = ("ep", "etp")
DROP_ORDER = ("dominant", "attention", "precision", "mfu", "days", "gpu_hours", "usd", "tokens",
              "step", "mem")
"""Narrow layout: columns left out, in this order, while the table is wider than the terminal,
never an objective's (objective_columns). After the least read, the figures another column
implies: days and GPU-hours follow from tokens/s, dollars from GPU-hours, tokens/s from the
step time at one global batch. The knobs stay: they name the plan."""
COST_COLUMNS = ("gpu_hours", "usd")
"""A --train-tokens budget's cost: columns under a cost objective and with --wide, else the
line under the table (notes.cost_line)."""
OBJECTIVE_COLUMNS = {"throughput": "tokens", "latency": "step", "gpus": "num_gpus"}
"""The column that shows each objective (cost: objective_columns)."""


def objective_columns(objectives: list[str], keys: set[str]) -> set[str]:
    """The columns of what the search optimises, which the narrow layout never cuts: cost is
    US dollars where the plans have a price (the `usd` column is there), else GPU-hours
    (targets.cost_of)."""
    return {("usd" if "usd" in keys else "gpu_hours") if o == "cost" else OBJECTIVE_COLUMNS[o]
            for o in objectives}


def new_table(title: str) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))


def table_width(headers: list[str], justify: list[bool], cells: list[list[str]]) -> int:
    """Columns the table takes when nothing is wrapped (measured by rich itself)."""
    t = new_table("")
    for h, right in zip(headers, justify, strict=True):
        t.add_column(h, justify="right" if right else "left", no_wrap=True)
    for r in cells:
        t.add_row(*r)
    return Console(width=10_000).measure(t).maximum


def layout(shown: list[Shown], objectives: list[str], wide: bool, width: int,
           one_count: bool = True, one_batch: bool = True) -> tuple[list[Cell], list[str],
                                                                    list[str]]:
    """(columns to show, "header value" pairs every row shares, columns left out);
    `one_count` / `one_batch`: the search had one GPU count / one global batch, which the
    header line names already."""
    budget = bool(shown) and all("days" in s.row for s in shown)  # --train-tokens given
    costed = "cost" in objectives or budget
    cols = [c for c in COLUMNS if c[0] != "gpu_hours" or costed]
    if one_batch:  # every row has the header's batch; a batch range adds the column
        cols = [c for c in cols if c[0] != "gbs"]
    # days with a token budget, dollars where the profiles have prices (cost across types)
    cols = [c for c in cols if c[0] not in ("days", "usd") or all(
        isinstance(s.row.get(c[0]), float) and math.isfinite(s.row[c[0]]) for s in shown)]
    cols = [c for c in cols if c[0] != "usd" or costed]
    multi = len({s.row["num_gpus"] for s in shown}) > 1
    # expert degrees only where some row has experts split (a dense model's are all 1)
    cols = [c for c in cols if c[0] not in EXPERT_KNOBS
            or any(int(s.row.get(c[0], 1)) > 1 for s in shown)]
    if wide:  # every column, the knobs that tell rows apart (precision, attention) too
        cols = [c for c in cols if c[0] != "num_gpus" or multi]
        return cols, [], []
    # a budget's cost without a cost objective: a line under the table (notes.cost_line), --wide
    dropped = [c[0] for c in cols if c[0] in COST_COLUMNS and "cost" not in objectives]
    cols = [c for c in cols if c[0] not in dropped]
    shared: list[str] = []
    keep: list[Cell] = []
    for c in cols:
        values = {c[4](s, True) for s in shown}
        if c[0] in HOISTABLE and len(values) == 1:
            value = values.pop()
            if c[0] != "num_gpus" or not one_count:
                none = "no" if c[0] == "sp" else "none"  # sequence parallel yes or no
                shared.append(f"{SHARED_NAMES.get(c[0], c[1])} "
                              f"{none if value == '-' else value}")
        else:
            keep.append(c)
    kept = objective_columns(objectives, {c[0] for c in keep})
    for name in DROP_ORDER:
        cells = [[c[4](s, False) for c in keep] for s in shown]
        if table_width([c[2] for c in keep], [c[3] for c in keep], cells) <= width:
            break
        if name not in kept and any(c[0] == name for c in keep) \
                and not names_rows(shown, keep, name):
            keep = [c for c in keep if c[0] != name]
            dropped.append(name)
    return keep, shared, dropped


def names_rows(shown: list[Shown], keep: list[Cell], name: str) -> bool:
    """Whether knob column `name` is all that tells two rows apart: two plans that differ
    only in precision read as one without it (the figures columns name no plan)."""
    if name not in KNOBS:
        return False
    knobs = [c for c in keep if (c[0] in KNOBS or c[0] == "offload") and c[0] != name]
    seen = {tuple(c[4](s, False) for c in knobs) for s in shown}
    return len(seen) < len(shown)


def legend(shown: list[Shown], wide: bool, headers: set[str] | None = None) -> str:
    """One line explaining every abbreviation that appears in the shown rows (in the columns
    named by `headers`, when given: a knob on the shared line is written out in full)."""
    def seen(*names: str) -> bool:
        return headers is None or bool(headers & set(names))

    rows = [s.row for s in shown]
    parts = []
    offload = seen("off", "offload")
    scheds = {r["schedule"] for r in rows if r["pp"] > 1} if seen("sched", "schedule") else set()
    names = {"int": "int = interleaved 1F1B", "zb": "zb = zero-bubble (ZB-H1)",
             "1f1b": "1f1b = one-forward-one-backward", "gpipe": "gpipe = all forwards first"}
    parts += [names[SHORT.get(s, s)] for s in sorted(scheds) if SHORT.get(s, s) in names]
    if scheds and any(r["pp"] > 1 and r["vpp"] > 1 for r in rows):
        parts.append("vN = N model chunks per pipeline rank")
    if scheds:
        used = {SPLIT_SHORT.get(x, x) for s in shown if s.row["pp"] > 1 for x in s.splits}
        parts += [SPLIT_LEGEND[k] for k in SPLIT_LEGEND if k in used]
    if any(len(s.splits) > 1 for s in shown):
        parts.append("a=b = splits that score the same, one row")
    if any(len(s.zeros) > 1 for s in shown):
        dp1 = all(s.row["dp"] == 1 for s in shown if len(s.zeros) > 1)
        parts.append("zero A-B = ZeRO stages that score the same, one row" + (" (equal at dp 1: "
                     "nothing to shard)" if dp1 else ""))
    if seen("sp") and any(r["sp"] for r in rows):
        parts.append("sp y = sequence parallel")
    if seen("rc", "recompute") and any(r["recompute"] != "none" for r in rows):
        parts.append(("recompute" if wide else "rc = recompute (sel = selective)") + ", :N = "
                     "on N layers per stage")
    if offload and any(r["offload_optimizer"] for r in rows):
        parts.append("opt = optimizer states on the host")
    if offload and any(s.row["offload_params"] and (wide or s.optimizers != [False, True])
                       for s in shown):
        parts.append(("params" if wide else "par") + " = parameters on the host")
    both = [s for s in shown if s.row["offload_params"] and True in s.optimizers]
    if offload and not wide and any(False not in s.optimizers for s in both):
        parts.append("o+p = both")
    if offload and any(len(s.optimizers) > 1 for s in both):
        parts.append(("params (+opt: same)" if wide else "p=o+p") + " = the parameters alone "
                     "or with the optimizer states on the host: they score the same, one row")
    if seen("dp") and any(r.get("dp_shard") for r in rows):
        parts.append("dp D/S = HSDP, ZeRO shard groups of S replicated D/S times")
    if seen("prec", "precision") and any(r.get("grad_reduce") for r in rows):
        parts.append("rX = gradients reduced in X")
    if seen("GPU-h", "USD") and rows and "gpu_hours" in rows[0] and "days" not in rows[0]:
        from autoplan.search.targets import COST_TOKENS_DEFAULT

        parts.append(f"GPU-h and USD are per {COST_TOKENS_DEFAULT:,.0f} tokens (--train-tokens "
                     "sets the budget)")
    if seen("mem", "mem GiB", "GiB") and any(r.get("mem_tight_gib", 0.0) > 0 for r in rows):
        parts.append("GiB! = tight: fits with the allocator slack priced (its median in "
                     "published OOM messages), not with its 75th percentile")
    if seen("MFU") and any(r.get("precision") == "fp8" for r in rows):
        parts.append("MFU = against the dense peak of the row's precision (fp8's, twice "
                     "bf16's, for an fp8 row)")
    if seen("step s") and any("band" in r for r in rows):
        parts.append("± = the cost model's error band for that prediction")
    if seen("MFU") and any(above_validated(r) for r in rows):
        parts.append("MFU? = above the MFU predicted for every validated run of the plan's "
                     "kind on its GPU: the validation does not reach it")
    return "legend: " + "; ".join(parts) if parts else ""


def ranked_table(shown: list[Shown], title: str, objectives: list[str], wide: bool = False,
                 width: int = 80, one_count: bool = True,
                 one_batch: bool = True) -> tuple[Table, list[str], list[str]]:
    """The table, the knobs every row shares and the columns left out for width. The
    objective's columns never wrap; should the table still be too wide once `layout` has left
    out all it may, rich wraps the other cells rather than cut the objective's figures."""
    cols, shared, dropped = layout(shown, objectives, wide, width, one_count, one_batch)
    whole = objective_columns(objectives, {c[0] for c in cols})
    t = new_table(title)
    for c in cols:
        t.add_column(c[1] if wide else c[2], justify="right" if c[3] else "left",
                     no_wrap=wide or c[0] in whole)
    for s in shown:
        t.add_row(*[c[4](s, wide) for c in cols])
    return t, shared, dropped


def counts_table(counts: dict[str, int], total: int) -> Table:
    t = Table(title="candidates by outcome (first reason)", box=box.SIMPLE_HEAD)
    t.add_column("reason")
    t.add_column("count", justify="right")
    t.add_column("share", justify="right")
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        t.add_row(k, f"{v:,}", f"{v / max(total, 1):.1%}")
    return t
