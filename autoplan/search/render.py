"""The terminal view of a search: the ranked table, a legend for its abbreviations, why the
winner wins, the count of candidates by reason, and the nearest miss when nothing fits.

The default layout fits the terminal (80 columns when there is none): knobs that every shown
plan shares move to one line above the table, cells are abbreviated, equivalent plans share
a row and less important columns are left out, never the objective's. `--wide` prints every
column in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from autoplan.display import days, sig, terminal_width, whole
from autoplan.search.engine import SearchResult

SHORT = {"interleaved-1f1b": "int", "zero-bubble": "zb", "1f1b": "1f1b", "gpipe": "gpipe"}
RECOMPUTE_SHORT = {"none": "-", "selective": "sel", "full": "full"}
DOMINANT_SHORT = {"compute": "compute", "recompute": "recomp", "tp_comm": "tp", "cp_comm": "cp",
                  "pp_bubble": "bubble", "pp_comm": "pp", "dp_comm": "dp", "offload": "offload",
                  "optimizer": "optim"}
FIGURES = ("mem_gib", "step_s", "tokens_per_s")
KNOBS = ("cluster", "num_gpus", "gbs", "dp", "tp", "pp", "cp", "ep", "etp", "sp", "schedule",
         "vpp", "split", "zero", "offload_optimizer", "offload_params", "recompute",
         "recompute_layers", "mbs", "precision", "attention", "dp_shard", "grad_reduce")
MERGEABLE = ("zero", "split", "offload_optimizer")
"""Knobs whose values can give identical figures (ZeRO at dp 1, balanced = even splits, the
optimizer on the host or not once the parameters are: their states go there together)."""
RECOMPUTE_KNOBS = ("recompute", "recompute_layers")
LAYOUT = ("num_gpus", "dp", "tp", "pp", "cp")


@dataclass
class Shown:
    """One table row: a ranked plan and the equivalent plans merged into it."""

    rank: int
    row: dict[str, Any]
    zeros: list[int]
    splits: list[str]
    optimizers: list[bool] = field(default_factory=list)
    """offload_optimizer of the plans merged (both: the same figures with and without)."""
    folded: list[tuple[int, str]] = field(default_factory=list)
    """(rank, recompute cell) of the slower recompute variants folded into the row (fold)."""


def same_figures(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = FIGURES + (("host_gib",) if "host_gib" in a and "host_gib" in b else ())
    return all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12) for k in keys)


def tight(r: dict[str, Any]) -> bool:
    return float(r.get("mem_tight_gib") or 0.0) > 0


def folds_into(s: Shown, r: dict[str, Any]) -> bool:
    """Whether `r`, ranked below `s`, is the plan of `s` with other recompute that buys nothing:
    slower, and `s` fits without it at least as well (not tight where `r` is not). A row of
    its own for it hid the other layouts (user test 37: rows 2-5 and 7 of a 10-row table were
    the winner with recompute on 1-4 layers); top.yaml still lists it."""
    if all(r.get(k) == s.row.get(k) for k in RECOMPUTE_KNOBS):
        return False
    same = all(r.get(n) == s.row.get(n) for n in KNOBS
               if n not in MERGEABLE and n not in RECOMPUTE_KNOBS)
    return (same and int(r["zero"]) in s.zeros and r["split"] in s.splits
            and bool(r["offload_optimizer"]) in s.optimizers
            and r["tokens_per_s"] <= s.row["tokens_per_s"] and r["step_s"] >= s.row["step_s"]
            and (tight(r) or not tight(s.row)))


def collapse(rows: list[dict[str, Any]], limit: int, fold: bool = False) -> list[Shown]:
    """Merge rows that differ only in ZeRO stage, layer split or (parameters on the host) the
    optimizer's place and score identically; with `fold`, fold slower recompute variants into
    their plan's row (folds_into); keep the first `limit` distinct rows in rank order."""
    shown: list[Shown] = []
    for k, r in enumerate(rows, 1):
        key = tuple(r.get(n) for n in KNOBS if n not in MERGEABLE)
        for s in shown:
            if tuple(s.row.get(n) for n in KNOBS if n not in MERGEABLE) == key \
                    and same_figures(s.row, r):
                s.zeros = sorted({*s.zeros, int(r["zero"])})
                s.splits = sorted({*s.splits, r["split"]})
                s.optimizers = sorted({*s.optimizers, bool(r["offload_optimizer"])})
                break
            if fold and folds_into(s, r):
                s.folded.append((k, recompute_cell(r, False)))
                break
        else:
            if len(shown) == limit:
                break
            shown.append(Shown(k, r, [int(r["zero"])], [r["split"]],
                               [bool(r["offload_optimizer"])]))
    return shown


def dp_cell(r: dict[str, Any]) -> str:
    """dp, or dp/shard under HSDP (dp / shard replicas of each ZeRO shard group)."""
    shard = int(r.get("dp_shard") or 0)
    return f"{r['dp']}/{shard}" if shard else str(r["dp"])


def precision_cell(r: dict[str, Any]) -> str:
    """The precision, and the gradient reduce dtype where the plan names one."""
    reduce = r.get("grad_reduce") or ""
    return f"{r['precision']} r{reduce}" if reduce else str(r["precision"])


def zero_cell(s: Shown) -> str:
    z = s.zeros
    if len(z) == 1:
        return str(z[0])
    return f"{z[0]}-{z[-1]}" if z == list(range(z[0], z[-1] + 1)) else ",".join(map(str, z))


SPLIT_SHORT = {"even": "even", "balanced": "bal", "ends": "ends", "embed-loss": "emb",
               "deepspeed": "ds"}
"""The layer splits as the table writes them (search_space.Split values)."""
SPLIT_LEGEND = {
    "bal": "bal = layers balanced against the embedding and head stages",
    "ends": "ends = first and last stage one layer lighter",
    "emb": "emb = the embedding and the loss on stages of their own",
    "ds": "ds = DeepSpeed's partition (type:transformer)",
}


def sched_cell(r: dict[str, Any], splits: list[str]) -> str:
    if r["pp"] <= 1:
        return "-"
    out = SHORT.get(r["schedule"], r["schedule"])
    if r["vpp"] > 1:
        out += f" v{r['vpp']}"
    if len(splits) > 1 or splits[0] != "even":
        out += " " + "=".join(SPLIT_SHORT.get(x, x) for x in splits)
    return out


def recompute_cell(r: dict[str, Any], wide: bool) -> str:
    rc = r["recompute"] if wide else RECOMPUTE_SHORT.get(r["recompute"], r["recompute"])
    if r["recompute"] != "none" and r["recompute_layers"] >= 0:
        rc += f":{r['recompute_layers']}"
    return rc


def offload_cell(r: dict[str, Any], wide: bool, optimizers: list[bool] | None = None) -> str:
    """What is on the host; "p=o+p" where the optimizer's place scores the same (collapse):
    the parameters alone or with the optimizer states."""
    if optimizers and len(optimizers) > 1:
        if r["offload_params"]:  # wide: also the shared line's words, with no legend
            return "params (+opt: same)" if wide else "p=o+p"
        return "=".join(offload_cell(r | {"offload_optimizer": o}, wide) for o in (False, True))
    on = [k for k, flag in (("opt", r["offload_optimizer"]), ("params", r["offload_params"]))
          if flag]
    if not wide and len(on) == 2:
        return "o+p"
    return "+".join(k if wide else k[:3] for k in on) or "-"


def mem_cell(r: dict[str, Any]) -> str:
    """GiB per GPU, with "!" where the plan is tight (ranking.frame's mem_tight_gib)."""
    return f"{r['mem_gib']:.1f}" + ("!" if r.get("mem_tight_gib", 0.0) > 0 else "")


def above_validated(r: dict[str, Any]) -> bool:
    """Whether the row's predicted MFU lies above every validated run's of its kind on its GPU
    (ranking.frame's above_validated; absent: no validated range to hold it against)."""
    return bool(r.get("above_validated", False))


def mfu_cell(r: dict[str, Any]) -> str:
    """MFU, with "?" where it lies above what the validated runs of its kind were predicted."""
    return f"{r['mfu']:.1%}" + ("?" if above_validated(r) else "")


def step_cell(r: dict[str, Any]) -> str:
    band = r.get("band")
    return sig(r["step_s"]) + (f" ±{band:.0%}" if isinstance(band, float) else "")


def tokens_cell(v: float, wide: bool) -> str:
    if wide or v < 1e4:
        return f"{v:,.0f}"
    return f"{sig(v / 1e6, 3)}M" if v >= 1e6 else f"{sig(v / 1e3, 3)}k"


def usd_cell(r: dict[str, Any]) -> str:
    """US dollars, "-" where the profile has no price."""
    v = r.get("usd")
    return whole(v) if isinstance(v, float) and math.isfinite(v) else "-"


def days_cell(r: dict[str, Any]) -> str:
    """Days to train (display.days); "-" where there is no figure."""
    v = r.get("days")
    return days(v) if isinstance(v, float) and math.isfinite(v) else "-"


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
line under the table (cost_line)."""
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
    # a budget's cost without a cost objective: a line under the table (cost_line), --wide
    dropped = [c[0] for c in cols if c[0] in COST_COLUMNS and "cost" not in objectives]
    cols = [c for c in cols if c[0] not in dropped]
    shared: list[str] = []
    keep: list[Cell] = []
    for c in cols:
        values = {c[4](s, True) for s in shown}
        if c[0] in HOISTABLE and len(values) == 1:
            value = values.pop()
            if c[0] != "num_gpus" or not one_count:
                shared.append(f"{SHARED_NAMES.get(c[0], c[1])} "
                              f"{'none' if value == '-' else value}")
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


def shown_rows(result: SearchResult, data: dict[str, Any], top: int) -> list[Shown]:
    """The rows of the table: the ranked plans --out keeps (summary.json and top.yaml), with
    equivalent ones sharing a row; never a plan ranked below them."""
    return collapse([with_band(r) for r in data["top"]], top, fold=True)


def with_band(row: dict[str, Any]) -> dict[str, Any]:
    """A summary row with its error band where step_cell reads it (ranking.frame's
    `error_band`: a ranking by one objective and a Pareto front alike)."""
    band = row.get("error_band")
    return row | {"band": float(band)} if isinstance(band, (int, float)) else row


def kept_text(data: dict[str, Any]) -> str:
    """" (36,000 kept: ...)" when a GPU-count range kept only some of the scored rows (the
    ones ranked and written to trials.csv.gz); empty when every scored row was kept."""
    from autoplan.search.engine import KEEP_PER_COUNT

    kept = data.get("kept", data["scored"])
    if kept >= data["scored"]:
        return ""
    return (f" ({kept:,} kept: the best {KEEP_PER_COUNT:,} per GPU count and its "
            f"{KEEP_PER_COUNT:,} nearest misses)")


LISTED_COUNTS = 12
"""GPU counts a header writes out before it shortens the list to its first and last."""


def counts_text(gpus: list[int], typed_range: Any = None) -> str:
    """The GPU counts as the user asked: a list as the list ("8, 16 or 32": not "8..32",
    which reads as every count between), a range of more than four counts as the range it
    searched ("64..1024 (12 counts)"); a list past LISTED_COUNTS shortened with "..."."""
    n = len(gpus)
    if n == 1:
        return f"{gpus[0]}"
    if typed_range and n > 4:
        return f"{gpus[0]}..{gpus[-1]} ({n} counts)"
    if n > LISTED_COUNTS:
        return f"{', '.join(map(str, gpus[:LISTED_COUNTS - 2]))}, ..., {gpus[-1]} ({n} counts)"
    return f"{', '.join(map(str, gpus[:-1]))} or {gpus[-1]}"


def plans_text(n: int) -> str:
    return f"{n} plan{'' if n == 1 else 's'}"


def table_title(data: dict[str, Any], multi: bool, merged: bool,
                rows: int | None = None) -> str:
    """"Pareto front (5 plans; throughput vs cost)" or "top 10 plans by throughput"; "top 10
    plans by throughput, in 5 rows (...)" where `rows` of the table hold them: what `#`
    numbers is each row's first plan's rank (top.yaml's order), so it skips the others (the
    ones merged, and the recompute variants fold_line names)."""
    if multi:
        return f"Pareto front ({plans_text(data['pareto_size'])}; {' vs '.join(data['objectives'])})"
    plans = len(data["top"])
    return (f"top {plans_text(plans)} by {data['objectives'][0]}"
            + (f", in {rows} row{'' if rows == 1 else 's'}" if rows and rows < plans else "")
            + (" (equivalent plans share a row)" if merged else ""))


def ranks_text(ranks: list[int]) -> str:
    """Ranks as "#2-5, #7"."""
    runs: list[list[int]] = []
    for k in sorted(ranks):
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return ", ".join(f"#{r[0]}-{r[-1]}" if len(r) > 1 else f"#{r[0]}" for r in runs)


def fold_line(shown: list[Shown], more: int | None, top: int) -> str | None:
    """What the rows fold (collapse's `fold`) and the --top that shows `top` rows."""
    parts = [f"{ranks_text([k for k, _ in s.folded])} = #{s.rank} with recompute "
             f"{', '.join(dict.fromkeys(cell for _, cell in s.folded))}"
             for s in shown if s.folded]
    if not parts and more is None:
        return None
    text = ("slower recompute variants share their plan's row (it fits without them; top.yaml "
            f"lists them): {'; '.join(parts)}") if parts else ""
    if more is not None:
        text += f"{'; ' if text else ''}--top {more} shows {top} rows"
    return text


def top_for_rows(result: SearchResult, want: int) -> int | None:
    """The --top whose table holds `want` rows (shown_rows), or None where the ranking has too
    few plans for them (or they lie past 50 plans a row)."""
    from autoplan.search.nearest import row_capacities
    from autoplan.search.ranking import frame

    req, sc = result.request, result.scored
    rows = result.order[:50 * want]
    records = frame(sc, rows, req.space, req.targets, result.front,
                    row_capacities(req, sc)).to_dict(orient="records")
    shown = collapse([with_band(r) for r in records], want, fold=True)
    return shown[-1].rank if len(shown) == want and len(rows) > 0 else None


def amount(value: float) -> str:
    """Dollars or GPU-hours: whole from 100 on, else 3 significant figures."""
    return whole(value) if abs(value) >= 100 else sig(value)


def tokens_text(tokens: float) -> str:
    """A token budget as people write it: 1e12, 3e11, 2.5e12."""
    return f"{tokens:.3g}".replace("e+0", "e").replace("e+", "e")


def cost_line(data: dict[str, Any], shown: list[Shown]) -> str | None:
    """With --train-tokens and no cost column: what the first plan costs, at which price per
    GPU-hour, and the flag that changes it (its summary row's gpu_hours and usd)."""
    tokens = (data.get("targets") or {}).get("train_tokens")
    row = shown[0].row if shown else {}
    hours = row.get("gpu_hours")
    if tokens is None or data.get("by_cluster") or not isinstance(hours, (int, float)) \
            or not math.isfinite(hours) or hours <= 0:
        return None
    usd, where = row.get("usd"), data["cluster"]
    if isinstance(usd, (int, float)) and math.isfinite(usd):
        price = (f"${amount(usd)} at ${usd / hours:.2f}/GPU-h (--price {where}=USD to "
                 "change)")
    else:
        price = f"no price ({where} has no price_per_gpu_hour; --price {where}=USD sets one)"
    return (f"#{shown[0].rank} for {tokens_text(float(tokens))} tokens: {amount(hours)} "
            f"GPU-hours, {price}")


def p75_alternative(result: SearchResult) -> dict[str, Any] | None:
    """Where plan #1 of a single-objective ranking is tight (fits at the allocator's median
    slack, not at its 75th percentile): the best-ranked plan that fits at both, with its
    change in the objective's figure (`rank` None: no feasible plan does); else None.
    Nothing reorders the ranking: `--memory-slack p75` ranks only such plans."""
    from autoplan.cost.memory import tight_by_bytes
    from autoplan.search.nearest import row_capacities
    from autoplan.search.targets import display_value

    req, sc, order = result.request, result.scored, result.order
    c = sc.cols
    if req.targets.multi or not len(order) or "mem_allocator" not in c:
        return None
    is_tight = tight_by_bytes(c["mem_total"][order], c["mem_allocator"][order],
                              row_capacities(req, sc)[order]) > 0
    if not is_tight[0]:
        return None
    roomy = np.flatnonzero(~is_tight)
    if not len(roomy):
        return {"rank": None}
    j, best = int(roomy[0]), int(order[0])
    i, objective = int(order[j]), req.targets.objectives[0]
    first, other = (display_value(objective, float(c["objectives"][k, 0])) for k in (best, i))
    return {"rank": j + 1, "num_gpus": int(c["num_gpus"][i]),
            "parallel": degrees(c, i),
            "mem_gib": float(c["mem_total"][i]) / 2**30,
            "tokens_per_s": float(c["tokens_per_s"][i]), "step_s": float(c["time_step"][i]),
            "objective": objective, "change": other / first - 1.0}


OBJECTIVE_FIGURES = {"throughput": "tokens/s", "latency": "step time", "cost": "cost",
                     "gpus": "GPUs"}


def p75_line(data: dict[str, Any], shown: list[Shown]) -> str | None:
    """"#1 is tight: the best plan that also fits at the 75th-percentile slack is #3 ..."."""
    alt = data.get("p75_alternative")
    if not alt or not shown:
        return None
    head = f"#{shown[0].rank} is tight (GiB!)"
    if alt["rank"] is None:
        return (f"{head}, and no feasible plan fits at the allocator's 75th-percentile slack: "
                "--memory-slack p75 finds none")
    ranks = {s.rank for s in shown}
    where = "" if alt["rank"] in ranks else \
        f", {layout_text(alt['parallel'])}, {alt['mem_gib']:.1f} GiB, below the table"
    figure = OBJECTIVE_FIGURES[alt["objective"]]
    change = (f"{alt['num_gpus']} GPUs" if alt["objective"] == "gpus"
              else f"{alt['change']:+.1%} {figure}")
    return (f"{head}: the best plan that also fits at the allocator's 75th-percentile slack is "
            f"#{alt['rank']} ({change}{where}); --memory-slack p75 ranks only those")


def layout_text(par: dict[str, Any]) -> str:
    """"dp16 tp1 pp1", with cp, ep and etp where above 1."""
    return " ".join(f"{k}{par[k]}" for k in ("dp", "tp", "pp", "cp", "ep", "etp")
                    if k in par and (k in ("dp", "tp", "pp") or par[k] > 1))


def degrees(c: dict[str, np.ndarray], i: int) -> dict[str, int]:
    """Row i's parallel degrees, the expert ones too (plan_table.expert_col: 1 when dense)."""
    from autoplan.plan_table import expert_col

    return {**{k: int(c[k][i]) for k in LAYOUT[1:]},
            **{k: int(expert_col(c, k)[i]) for k in ("ep", "etp")}}


def other_precision(result: SearchResult) -> dict[str, Any] | None:
    """Under a throughput or latency ranking, the best plan of another precision class than
    plan #1's where #1's error band or lean is far wider than #1's margin over it: the runs
    behind #1's band took so much longer than priced (error_bias) that, leaned, the order
    flips, or #1's band holds the margin and is at least twice the other's. Else None.
    Nothing adds the lean to a prediction or reorders the ranking: it says "measure both"."""
    from autoplan.cost.error_band import precision_class

    req, sc, order = result.request, result.scored, result.order
    c, t = sc.cols, req.targets
    if t.multi or t.objectives[0] not in ("throughput", "latency") or not len(order) \
            or "band" not in c or "bias" not in c:
        return None
    names = [p.value for p in req.space.precision]
    precision = np.array(names)[np.asarray(c["precision"])[order]]
    classes = np.array([str(precision_class(p)) for p in precision])
    others = np.flatnonzero(classes != classes[0])
    if not len(others):
        return None
    j, best = int(others[0]), int(order[0])
    i = int(order[j])
    band1, band2 = float(c["band"][best]), float(c["band"][i])
    bias1, bias2 = float(c["bias"][best]), float(c["bias"][i])
    if t.objectives[0] == "throughput":
        tokens1, tokens2 = float(c["tokens_per_s"][best]), float(c["tokens_per_s"][i])
        gap, flips = tokens1 / tokens2 - 1.0, tokens1 / (1 + bias1) < tokens2 / (1 + bias2)
    else:
        step1, step2 = float(c["time_step"][best]), float(c["time_step"][i])
        gap, flips = step2 / step1 - 1.0, step1 * (1 + bias1) > step2 * (1 + bias2)
    if not (flips or (band1 > gap and band1 >= 2 * band2)):
        return None
    return {"rank": j + 1, "precision": str(precision[j]),
            "parallel": degrees(c, i),
            "step_s": float(c["time_step"][i]), "tokens_per_s": float(c["tokens_per_s"][i]),
            "error_band": band2, "error_bias": bias2, "slower_as_priced": gap,
            "lean_flips": bool(flips), "winner": {"precision": str(precision[0]),
                                                  "error_band": band1, "error_bias": bias1},
            "moe": req.model.moe is not None}


def other_precision_line(data: dict[str, Any]) -> str | None:
    """"but the best bf16 plan (#4, ...) is 6.0% slower as priced, and #1's ±130% is the error
    of fp8 MoE runs, which took 123% longer than priced on average ...: measure both"."""
    from autoplan.display import bias_words

    o = data.get("other_precision")
    if not o:
        return None
    w = o["winner"]
    moe = " MoE" if o["moe"] else ""
    lean = (f" ({o['precision']}{moe} runs: {o['error_bias']:+.0%})"
            if abs(o["error_bias"]) >= 0.005 else "")
    below = ", below the table" if o["rank"] > len(data.get("top") or ()) else ""
    return (f"but the best {o['precision']} plan (#{o['rank']}{below}, "
            f"{layout_text(o['parallel'])}, "
            f"step {sig(o['step_s'])} s ±{o['error_band']:.0%}) is {o['slower_as_priced']:.1%} "
            f"slower as priced, and #1's ±{w['error_band']:.0%} is the error of "
            f"{w['precision']}{moe} runs{bias_words(w['error_bias'])}{lean}: measure both")


def render(console: Console, result: SearchResult, data: dict[str, Any], top: int,
           wide: bool = False) -> None:
    width = terminal_width()
    console.width = max(width, 80)
    gpus = data["num_gpus"]
    where = counts_text(gpus, data.get("num_gpus_range"))
    batches = data.get("global_batch_range")
    batch = f"{batches[0]}..{batches[1]}" if batches else f"{data['global_batch_size']}"
    console.print(
        f"[bold]{data['model']}[/] on {where} x {data['cluster']}, global batch {batch}, "
        f"space {data['space']}, priced for runtime {data['runtime']}: {data['sampler']} search, "
        f"{data['candidates']:,} candidates, {data['scored']:,} scored, "
        f"{data['feasible_count']:,} feasible{kept_text(data)} in {data['seconds']:.2f} s")
    if data["top"]:
        shown = shown_rows(result, data, top)
        merged = any(len(s.zeros) > 1 or len(s.splits) > 1 or len(s.optimizers) > 1
                     for s in shown)
        title = table_title(data, result.request.targets.multi, merged, len(shown))
        table, shared, dropped = ranked_table(shown, title, data["objectives"], wide, width,
                                              len(gpus) == 1, not batches)
        if wide:
            console.width = max(width, Console(width=10_000).measure(table).maximum)
        if shared:
            console.print("every plan below: " + ", ".join(shared), markup=False)
        console.print(table)
        line = legend(shown, wide, {str(c.header) for c in table.columns})
        if dropped:
            names = {c[0]: c[1] for c in COLUMNS}
            line += f"{'; ' if line else ''}--wide adds: {', '.join(names[d] for d in dropped)}"
        if line:
            console.print(line, markup=False, style="dim")
        from autoplan.search.baseline import note_lines, why_lines

        more = None
        if len(shown) < len(data["top"]) and len(result.order) > len(data["top"]) \
                and not result.request.targets.multi:
            more = top_for_rows(result, top)
        headers = {str(c.header) for c in table.columns}
        lines = [*why_lines(result, data, shown), other_precision_line(data),
                 *note_lines(result, shown), p75_line(data, shown),
                 None if headers & {"GPU-h", "USD"} else cost_line(data, shown),
                 fold_line(shown, more, top)]
        for why in lines:
            if why:
                console.print(why, markup=False)
    console.print(counts_table(data["counts"], data["candidates"]))
    near = data.get("nearest")
    if near:
        p = near["plan"]
        # one line however narrow the terminal: the assignments are pasted into a shell
        console.print(f"[red]no feasible plan.[/] nearest{miss_where(data, p)} (as estimate "
                      f"--set): {miss_knobs(p)}, which", soft_wrap=True)
        for m in near["misses"]:
            console.print(f"  - {m}", markup=False)
        hint = more_gpus_text(near)
        if hint:
            console.print(hint, markup=False)


def more_gpus_text(near: dict[str, Any]) -> str:
    """"to find the fewest GPUs that fit: try --num-gpus 4..64 --objective gpus (...)" for a
    nearest miss that more GPUs may cure (nearest.more_gpus), else ""."""
    more = near.get("more_gpus")
    if not more:
        return ""
    what = "fit" if near.get("reason") in ("out-of-memory", "host-memory") else "meet the targets"
    return (f"to find the fewest GPUs that {what}: try --num-gpus {more['num_gpus']} "
            f"--objective gpus (the nearest, on {more['from']} GPUs, misses by "
            f"{1 + more['short']:.3g}x: {math.ceil(more['proportional']):,} GPUs if that "
            "shrank in proportion)")


def miss_where(data: dict[str, Any], p: dict[str, Any]) -> str:
    """' on N x PROFILE' where the search had several GPU types or counts (estimate takes
    one of each), else ''."""
    if "," in data.get("cluster", "") or len(data.get("num_gpus") or ()) > 1:
        return f" on {p['cluster']['num_gpus']} x {p['cluster']['profile']}"
    return ""


def miss_knobs(p: dict[str, Any]) -> str:
    """A plan (plan_to_dict's) as `estimate --set` assignments, so `estimate --model M
    --cluster C --num-gpus N --global-batch-size G --set ...` with them prices the same figure:
    the parallel degrees, the batch, the precision and the attention always (estimate's
    default precision is the device's, not a plan's bf16, and its default attention the one the
    runtime runs on the device: eager under Megatron on a V100), then every other field the
    plan sets away from a plan's default (ZeRO stage, offload, recompute, sequence parallelism,
    pipeline schedule and vpp, gradient reduce dtype)."""
    import shlex

    from autoplan.plan import Batch, Plan, plan_from_dict, plan_to_dict

    plan = plan_from_dict(dict(p))
    default = plan_to_dict(Plan(model=plan.model, cluster=plan.cluster,
                                batch=Batch(micro_batch_size=1, global_batch_size=1)))
    given = flat_fields(plan_to_dict(plan))
    default_fields = flat_fields(default)
    always = [k for k in given if k.startswith("parallel.")] + [
        "batch.micro_batch_size", "batch.global_batch_size", "precision", "attention"]
    rest = [k for k in given if k not in always
            and not k.startswith(("model", "cluster.", "predicted", "schema_version"))
            and given[k] != default_fields.get(k)]
    return " ".join(shlex.quote(f"{k}={set_value(given[k])}") for k in [*always, *rest])


def flat_fields(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A plan mapping's leaves by dotted key (`pipeline.vpp`), as `--set` names them."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in ("model", "predicted"):
            out |= flat_fields(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def set_value(value: Any) -> str:
    """A field's value as `--set` reads it (YAML): true/false, null, [a,b], or the text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(set_value(v) for v in value) + "]"
    return str(value)
