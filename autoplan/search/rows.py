"""The rows of the search table: which ranked plans share a row (collapse) and how each knob and
figure is written in a cell. Which columns show, and how wide, is table.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autoplan.display import days, sig, whole
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


def shown_rows(result: SearchResult, data: dict[str, Any], top: int) -> list[Shown]:
    """The rows of the table: the ranked plans --out keeps (summary.json and top.yaml), with
    equivalent ones sharing a row; never a plan ranked below them."""
    return collapse([with_band(r) for r in data["top"]], top, fold=True)


def with_band(row: dict[str, Any]) -> dict[str, Any]:
    """A summary row with its error band where step_cell reads it (ranking.frame's
    `error_band`: a ranking by one objective and a Pareto front alike)."""
    band = row.get("error_band")
    return row | {"band": float(band)} if isinstance(band, (int, float)) else row
