"""`autoplan estimate`, `autoplan models` and `autoplan clusters`: score one plan and list presets."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from autoplan import resources
from autoplan.cli_common import DECIMAL_NOTE, add_format_argument, amount, emit
from autoplan.cost.estimate import MEMORY_PARTS, TIME_PARTS, estimate_plan
from autoplan.cost.params import active_params, moe_layers, total_params
from autoplan.cost.runtimes import RUNTIMES
from autoplan.display import (
    bias_words,
    column,
    count,
    terminal_width,
    tight_words,
    unvalidated_words,
)
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS, ModelSpec
from autoplan.plan_args import add_plan_arguments, add_target_arguments, plan_from_args
from autoplan.plan_files import plan_to_dict
from autoplan.plan_rules import validate_plan
from autoplan.profile_files import available_profiles, not_a_profile
from autoplan.search_space import device_precision

GIB = 2**30
log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("estimate", help="memory per GPU and step time of one plan",
                       description="Score one plan with the cost model and explain it.")
    add_target_arguments(p, required=False)
    add_plan_arguments(p)
    p.add_argument("--train-tokens", type=amount("tokens", "1e12 or 1T"),
                   help=f"token budget, for days_to_train, e.g. 1e12 or 1T ({DECIMAL_NOTE})")
    add_format_argument(p)
    p.set_defaults(func=estimate_command)

    m = sub.add_parser("models", help="list model presets")
    add_format_argument(m)
    m.set_defaults(func=models_command)
    c = sub.add_parser("clusters", help="list hardware profiles")
    add_format_argument(c)
    c.set_defaults(func=clusters_command)


def _moe_and_shard(par: Any) -> str:
    """The degrees the header names only where they are set: ep, etp, FSDP's shard group."""
    return "".join(f" {k}={v}" for k, v in (("ep", par.ep), ("etp", par.etp))
                   if v > 1) + (f" dp_shard={par.dp_shard}" if par.dp_shard else "")


def _offload(plan: Any) -> str:
    parts = [k for k in ("optimizer", "params") if getattr(plan.offload, k)]
    return f" offload={'+'.join(parts)}" if parts else ""


def _runtime(args: argparse.Namespace, plan: Any) -> str | None:
    """--runtime, else the runtime a searched plan was priced for (its `predicted.runtime`), so
    that `estimate --plan` prints the numbers `search` ranked it by; a recorded runtime that is
    no preset (a traits file's name) cannot be found again and is said so."""
    if getattr(args, "runtime", None) is not None:
        return str(args.runtime)
    recorded = (plan.predicted or {}).get("runtime") if args.plan else None
    if not isinstance(recorded, str) or not recorded or recorded.startswith("autoplan"):
        return None  # autoplan's own: the device the plan is priced on picks CPU or CUDA
    if recorded in RUNTIMES:
        log.info("pricing for runtime %s, which the plan was priced for (--runtime to change)",
                 recorded)
        return recorded
    log.warning("the plan was priced for runtime %r, which is no preset: priced for autoplan's "
                "own instead; pass --runtime with that traits file to price it as before",
                recorded)
    return None


def estimate_command(args: argparse.Namespace) -> int:
    plan, model, cluster = plan_from_args(args)
    if args.train_tokens is not None and not (math.isfinite(args.train_tokens)
                                              and args.train_tokens > 0):
        raise ConfigError("--train-tokens", f"got {args.train_tokens}",
                          "expected a positive finite number of tokens")
    problems = validate_plan(plan, model, cluster)  # the rule set `autoplan train` applies
    if problems:  # a mistake in the plan (exit 2); not fitting or missing a target is exit 3
        raise ConfigError("plan", "; ".join(problems), "fix the plan (`autoplan search` lists "
                          "valid ones)")
    est = estimate_plan(plan, cluster, model, train_tokens=args.train_tokens,
                        runtime=_runtime(args, plan))
    data = {
        "feasible": est.feasible, "reasons": list(est.reasons), "memory": est.memory,
        "time": est.time, "tokens_per_s": est.tokens_per_s,
        "model_flops_per_step": est.model_flops_per_step, "mfu": est.mfu, "hfu": est.hfu,
        "days_to_train": est.days_to_train, "dominant": est.dominant,
        # without the file's `predicted` block: this estimate is the prediction now
        "num_params": est.num_params, "model": model.name,
        "plan": plan_to_dict(plan.replace(predicted=None)),
        "runtime": est.runtime, "profile": plan.cluster.profile,  # a name, or the file read
        "error_band": est.error_band, "error_bias": est.error_bias,
        "mfu_ceiling": None if est.mfu_ceiling is None else dataclasses.asdict(est.mfu_ceiling),
        "above_validated": est.above_validated,
    }

    def render(console: Console) -> None:
        par = plan.parallel
        note = "" if est.feasible else ", of an INFEASIBLE plan"
        if not est.feasible:
            console.print("[red bold]infeasible:[/]")
            for r in est.reasons:
                console.print(f"  - {r}", markup=False)
        console.print(
            f"[bold]{model.name}[/] ({count(est.num_params)} params) on "
            f"{cluster.num_gpus} x {cluster.profile.device.name}: dp={par.dp} tp={par.tp} "
            f"pp={par.pp} cp={par.cp}{_moe_and_shard(par)} sp={plan.sequence_parallel} "
            f"schedule={plan.pipeline.schedule.value} vpp={plan.pipeline.vpp} "
            f"zero={plan.zero_stage} recompute={plan.recompute.label()} "
            f"mbs={plan.batch.micro_batch_size} gbs={plan.batch.global_batch_size} "
            f"({count(plan.batch.global_batch_size * model.seq_len)} tokens) "
            f"precision={plan.precision.value}{_offload(plan)}")
        mem = Table(title=f"memory per GPU (worst stage){note}")
        mem.add_column("part")
        mem.add_column("GiB", justify="right")
        mem.add_column("share", justify="right")
        gib = column([est.memory[k] / GIB for k in (*MEMORY_PARTS, "total")],
                     est.memory["total"] / GIB, digits=4)
        for k, cell in zip(MEMORY_PARTS, gib[:-1], strict=True):
            mem.add_row(k, cell, f"{est.memory[k] / est.memory['total']:.0%}")
        mem.add_row("[bold]total[/]", f"[bold]{gib[-1]}[/]",
                    f"of {est.memory['capacity'] / GIB:.1f} GiB")
        if est.memory["host_total"]:
            mem.add_row("host (offload)", f"{est.memory['host_total'] / GIB:.2f}", "")
        tim = Table(title=f"time per step{note}")
        tim.add_column("part")
        tim.add_column("seconds", justify="right")
        tim.add_column("share", justify="right")
        secs = column([est.time[k] for k in (*TIME_PARTS, "step")], est.time["step"])
        for k, cell in zip(TIME_PARTS, secs[:-1], strict=True):
            tim.add_row(k, cell, f"{est.time[k] / est.time['step']:.0%}")
        tim.add_row("[bold]step[/]", f"[bold]{secs[-1]}[/]", f"± {est.error_band:.0%}")
        console.print(mem, tim)
        line = ("[red](infeasible plan)[/] " if not est.feasible else "") + (
                f"tokens/s {est.tokens_per_s:,.0f}   MFU {est.mfu:.1%}   HFU {est.hfu:.1%}"
                f"{' (of the fp8 peak)' if plan.precision.value == 'fp8' else ''}   "
                f"biggest cost: {est.dominant} ({est.time[est.dominant] / est.time['step']:.0%})")
        if est.days_to_train is not None:
            line += f"   days to train: {est.days_to_train:.1f}"
        console.print(line)
        console.print(f"priced for runtime {est.runtime} on profile {plan.cluster.profile}: "
                      f"step {est.time['step']:.3g} s "
                      f"± {est.error_band:.0%} (validation error of runs of this kind"
                      f"{bias_words(est.error_bias)})", markup=False)
        if est.above_validated:
            console.print(f"[yellow]unvalidated:[/] {unvalidated_words(est.mfu, est.mfu_ceiling, cluster.profile.is_cpu)}")
        if est.feasible:
            console.print("[green]feasible[/]")
            if est.memory["tight_by"] > 0:
                console.print(f"[yellow]tight:[/] {tight_words(est.memory)}")
        else:
            console.print(f"[red]infeasible[/] ({len(est.reasons)} reason(s) above)")

    from autoplan.cli_common import resolve_format
    from autoplan.display import rounded

    emit(args, rounded(data) if resolve_format(args) == "yaml" else data, render)
    return 0 if est.feasible else 3


def model_row(m: ModelSpec) -> dict[str, Any]:
    """One preset as `models` lists it: parameters total and per token (the cost model's own
    counts, cost.params), the dense MLP's width only where some block has it (a MoE model's
    `ffn` is config.json's intermediate_size, unused when every block routes), the experts."""
    n_moe = moe_layers(m)
    experts = None if m.moe is None else {
        "routed": m.moe.num_experts, "ffn": m.moe.expert_ffn_hidden_size,
        "top_k": m.moe.experts_per_token, "shared": m.moe.num_shared_experts,
        "moe_layers": n_moe}
    return {"name": m.name, "params": total_params(m), "active": active_params(m),
            "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_heads,
            "kv_heads": m.kv_heads, "ffn": m.ffn if n_moe < m.num_layers else None,
            "dense_layers": m.num_layers - n_moe, "experts": experts, "vocab": m.vocab_size,
            "seq_len": m.seq_len, "mlp": m.mlp.value}


DENSE_COLUMNS = ("name", "params", "layers", "hidden", "heads", "ffn", "vocab", "seq_len", "mlp")
MOE_COLUMNS = ("name", "params", "active", "layers", "hidden", "experts", "top_k", "ffn",
               "seq_len")
"""The columns of each table: a MoE preset's experts and active parameters fit 80 columns only
without the heads, vocab and mlp of the dense table (in --format json)."""
HEADINGS = {"heads": "heads/kv", "seq_len": "seq", "top_k": "top-k", "experts": "experts"}
MOE_CAPTION = ("experts: routed experts x their ffn; top-k: routed experts per token +N "
               "shared; active: parameters a token passes through, embeddings included (model "
               "cards often leave them out); ffn: the dense MLP of the "
               "first N blocks, - if none; heads, vocab, mlp: --format json")


def _cells(r: dict[str, Any]) -> dict[str, str]:
    moe = r["experts"]
    ffn = "-" if r["ffn"] is None else str(r["ffn"])
    if moe is not None and r["ffn"] is not None:
        ffn = f"{r['dense_layers']}x{r['ffn']}"
    return {**{k: str(v) for k, v in r.items()}, "params": count(r["params"]),
            "active": count(r["active"]), "heads": f"{r['heads']}/{r['kv_heads']}", "ffn": ffn,
            "experts": "" if moe is None else f"{moe['routed']}x{moe['ffn']}",
            "top_k": "" if moe is None else
            f"{moe['top_k']}" + (f"+{moe['shared']}" if moe["shared"] else "")}


def models_command(args: argparse.Namespace) -> int:
    rows = [model_row(m) for m in PRESETS.values()]

    def table(title: str, keys: tuple[str, ...], chosen: list[dict[str, Any]],
              caption: str | None = None) -> Table:
        t = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 0, 0, 1 if caption is None else 0))  # the MoE one has 2 more
        for k in keys:
            t.add_column(HEADINGS.get(k, k), no_wrap=True,
                         justify="left" if k in ("name", "mlp") else "right")
        for r in chosen:
            cells = _cells(r)
            t.add_row(*[cells[k] for k in keys])
        return t

    def render(console: Console) -> None:
        console.width = min(console.width, terminal_width())
        console.print(table("model presets", DENSE_COLUMNS,
                            [r for r in rows if r["experts"] is None]))
        console.print(table("mixture-of-experts presets", MOE_COLUMNS,
                            [r for r in rows if r["experts"] is not None], MOE_CAPTION))

    emit(args, rows, render)
    return 0


def three(value: float) -> str:
    """A figure to 3 significant digits, no trailing zeros: a measured profile's 0.941905 GB/s
    as 0.942, so the table keeps its names whole at 80 columns; a datasheet's 25 as 25."""
    return f"{float(f'{value:.3g}'):g}"


def clusters_command(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    others: dict[Path, list[str]] = {}  # by the folder each was found in
    for name in available_profiles():
        try:
            p = load_profile(name, "profile")
        except ConfigError as err:  # one broken file in $AUTOPLAN_PROFILES hides no others
            where = resources.find(resources.PROFILES, name)
            what = not_a_profile(where) if where is not None else None
            if what is not None and where is not None:  # a traits file or plan kept there
                others.setdefault(where.parent, []).append(f"{where.name} ({what})")
                continue
            sys.stderr.write(f"autoplan clusters: warning: skipped {where or name}: {err}\n")
            continue
        # a calibrated profile's peaks carry its fitted compute factor: the device's own
        # (what MFU is stated against) is that divided back out; plans are priced at the
        # fitted peak (priced_peak_tflops), which the table shows
        own = p.calibrated_compute
        rows.append({"name": name, "device": p.device.name,
                     "memory_gib": p.device.memory_bytes / GIB,
                     "peak_tflops": {k: v / own / 1e12
                                     for k, v in p.device.peak_flops_per_s.items()},
                     "priced_peak_tflops": {k: v / 1e12
                                            for k, v in p.device.peak_flops_per_s.items()},
                     "calibrated_compute": own,
                     # what plans on it train in unless told otherwise (fp32 on a CPU)
                     "precision": device_precision(p.device.peak_flops_per_s, p.is_cpu),
                     "gpus_per_node": p.gpus_per_node,
                     "intra_node_gb_per_s": p.intra_node.bytes_per_s / 1e9,
                     "inter_node_gb_per_s": p.inter_node.bytes_per_s / 1e9,
                     "measured": p.measured is not None,
                     "calibrated": "calibration" in (p.measured or {})})

    def render(console: Console) -> None:
        t = Table(title="hardware profiles", caption="TF: peak TFLOP/s in the precision plans "
                  "on it train in (bf16, else fp16; fp32 on a CPU), as plans are priced at it; "
                  "intra/inter: GB/s inside a node / between nodes; a calibrated profile's are "
                  "fitted (its device's own peak, which MFU is stated against: --format json "
                  "peak_tflops)",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
        # a device name wraps at its spaces, never inside a word (A100-SXM4-80GB)
        word = max((len(w) for r in rows for w in r["device"].split()), default=0)
        for k in ("name", "device", "GiB", "TF", "/node", "intra", "inter", "source"):
            t.add_column(k, no_wrap=k == "name", min_width=min(word, 20) if k == "device"
                         else None,
                         justify="left" if k in ("name", "device", "source") else "right")
        for r in rows:
            peak = r["priced_peak_tflops"].get(r["precision"])  # None: no peak of that dtype
            t.add_row(r["name"], r["device"], f"{r['memory_gib']:.0f}",
                      "-" if peak is None else three(peak),
                      str(r["gpus_per_node"]), three(r["intra_node_gb_per_s"]),
                      three(r["inter_node_gb_per_s"]),
                      "calibrated" if r["calibrated"] else
                      "measured" if r["measured"] else "datasheet")
        console.width = min(console.width, terminal_width())
        console.print(t)

    from autoplan.cli_common import resolve_format
    from autoplan.display import rounded

    for folder in resources.search_dirs(resources.PROFILES):  # the user's first
        files = others.get(folder)
        if files:
            sys.stderr.write(f"autoplan clusters: skipped {len(files)} file(s) of {folder} "
                             f"that are no profiles: {', '.join(files)}\n")
    emit(args, rounded(rows) if resolve_format(args) == "yaml" else rows, render)
    return 0
