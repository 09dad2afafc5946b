"""The terminal view of a search: the ranked table (every knob, memory, step time, tokens/s, MFU,
dominant cost), the count of candidates by reason, and the nearest miss when nothing fits."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from autoplan.search.engine import SearchResult

SHORT = {"interleaved-1f1b": "int", "zero-bubble": "zb", "1f1b": "1f1b", "gpipe": "gpipe"}
WIDTH = 160
"""Columns the ranked table needs; a narrower terminal wraps it."""


def _knobs(r: dict[str, Any]) -> list[str]:
    offload = "+".join(k for k, on in (("opt", r["offload_optimizer"]),
                                       ("params", r["offload_params"])) if on) or "-"
    rc = r["recompute"]
    if rc != "none" and r["recompute_layers"] >= 0:
        rc += f":{r['recompute_layers']}"
    sched = SHORT.get(r["schedule"], r["schedule"]) if r["pp"] > 1 else "-"
    if r["pp"] > 1 and r["vpp"] > 1:
        sched += f" v{r['vpp']}"
    if r["split"] != "even":
        sched += " bal"
    return [str(r["dp"]), str(r["tp"]), str(r["pp"]), str(r["cp"]),
            "y" if r["sp"] else "-", sched, str(r["zero"]), offload, rc, str(r["mbs"])]


def ranked_table(rows: list[dict[str, Any]], title: str, objectives: list[str]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    multi_gpus = len({r["num_gpus"] for r in rows}) > 1
    if multi_gpus:
        t.add_column("gpus", justify="right", no_wrap=True)
    for name in ("#", "dp", "tp", "pp", "cp", "sp", "schedule", "zero", "offload",
                 "recompute", "mbs", "mem GiB", "step s", "tokens/s", "MFU", "dominant"):
        t.add_column(name, justify="left" if name in ("schedule", "offload", "recompute",
                                                      "dominant") else "right",
                     no_wrap=True)
    if "cost" in objectives:
        t.add_column("GPU-h", justify="right")
    for k, r in enumerate(rows, 1):
        cells = ([str(r["num_gpus"])] if multi_gpus else []) + [str(k), *_knobs(r), f"{r['mem_gib']:.1f}", f"{r['step_s']:.3g}",
                 f"{r['tokens_per_s']:,.0f}", f"{r['mfu']:.1%}", r["dominant"]]
        if "cost" in objectives:
            cells.append(f"{r['gpu_hours']:,.0f}")
        t.add_row(*cells)
    return t


def counts_table(counts: dict[str, int], total: int) -> Table:
    t = Table(title="candidates by outcome (first reason)")
    t.add_column("reason")
    t.add_column("count", justify="right")
    t.add_column("share", justify="right")
    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]):
        t.add_row(k, f"{v:,}", f"{v / max(total, 1):.1%}")
    return t


def render(console: Console, result: SearchResult, data: dict[str, Any], top: int) -> None:
    if not console.is_terminal:
        console.width = max(console.width, WIDTH)
    gpus = data["num_gpus"]
    where = f"{gpus[0]}" if len(gpus) == 1 else f"{gpus[0]}..{gpus[-1]} ({len(gpus)} counts)"
    console.print(
        f"[bold]{data['model']}[/] on {where} x {data['cluster']}, global batch "
        f"{data['global_batch_size']}, space {data['space']}: {data['sampler']} search, "
        f"{data['candidates']:,} candidates, {data['scored']:,} scored, "
        f"{data['feasible_count']:,} feasible in {data['seconds']:.2f} s")
    if data["top"]:
        title = (f"Pareto front ({data['pareto_size']} plans; {' vs '.join(data['objectives'])})"
                 if result.request.targets.multi else f"top {len(data['top'])} plans by "
                 f"{data['objectives'][0]}")
        console.print(ranked_table(data["top"], title, data["objectives"]))
    console.print(counts_table(data["counts"], data["candidates"]))
    near = data.get("nearest")
    if near:
        p = near["plan"]
        knobs = " ".join(f"{k}={v}" for k, v in p["parallel"].items())
        console.print(f"[red]no feasible plan.[/] nearest: {knobs} zero={p['zero_stage']} "
                      f"recompute={p['recompute']['policy']} "
                      f"mbs={p['batch']['micro_batch_size']}, which")
        for m in near["misses"]:
            console.print(f"  - {m}", markup=False)
