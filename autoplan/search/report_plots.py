"""The report's figures as inline PNGs: the Pareto front, memory per GPU and step time per plan.

Bars carry distinct labels (the rank and every knob that differs between the plans shown). The
time chart splits its axis: compute on one panel, communication, bubble and host work on a second
panel with its own scale, so a 2% all-reduce is as readable as a 90% GEMM share.
matplotlib is optional (`pip install autoplan[report]`) and imported lazily by the caller.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from autoplan.cost.estimate import MEMORY_PARTS
from autoplan.search.engine import SearchResult
from autoplan.search.pareto import pareto_mask
from autoplan.search.targets import gpu_hours

GIB = 2**30
MAX_POINTS = 20_000
"""Feasible candidates drawn in the scatter (a deterministic subsample beyond this)."""
BIG_PARTS = (("compute", "compute (GEMMs, attention, element-wise)"),
             ("recompute", "recompute (activation checkpointing)"))
SMALL_PARTS = (("tp_comm", "tensor-parallel collectives"),
               ("cp_comm", "context-parallel K/V exchange"),
               ("pp_bubble", "pipeline bubble"),
               ("pp_comm", "pipeline sends"),
               ("dp_comm", "data-parallel gradient sync"),
               ("offload", "offload transfers"),
               ("optimizer", "optimizer step"))
DP1_LABEL = "step-wide syncs (loss, grad norm) and FSDP host work, dp = 1"
"""What `dp_comm` holds when there is no data parallelism: no gradient sync at all."""


def data_uri(fig: Any, plt: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")  # legends outside the axes
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def plan_labels(result: SearchResult, rows: np.ndarray, ranks: list[int]) -> list[str]:
    """"#rank" plus every knob whose value differs between the plans in `rows`."""
    c = result.scored.cols
    from autoplan.plan_table import RECOMPUTE, SCHEDULES

    knobs: list[dict[str, str]] = []
    for i in rows:
        pp = int(c["pp"][i])
        sched = SCHEDULES[int(c["schedule"][i])].value if pp > 1 else ""
        if pp > 1 and int(c["vpp"][i]) > 1:
            sched += f" v{int(c['vpp'][i])}"
        rc = RECOMPUTE[int(c["recompute"][i])].value
        knobs.append({
            "gpus": f"{int(c['num_gpus'][i])} GPUs", "dp": f"dp{int(c['dp'][i])}",
            "tp": f"tp{int(c['tp'][i])}", "pp": f"pp{pp}", "cp": f"cp{int(c['cp'][i])}",
            "sp": "sp" if c["sp"][i] else "no-sp", "sched": sched,
            "split": "bal" if int(c["split"][i]) == 1 else "",
            "zero": f"zero{int(c['zero_stage'][i])}",
            "off": "+".join(n for n, k in (("opt-off", "offload_optimizer"),
                                          ("param-off", "offload_params")) if c[k][i]),
            "rc": "" if rc == "none" else f"{rc}:{int(c['recompute_layers'][i])}"
            if int(c["recompute_layers"][i]) >= 0 else rc,
            "mbs": f"mbs{int(c['mbs'][i])}",
        })
    varying = [k for k in knobs[0] if len({d[k] for d in knobs}) > 1] if knobs else []
    keep = [k for k in knobs[0] if k in varying or k in ("dp", "tp", "pp")] if knobs else []
    return [f"#{r} " + " ".join(d[k] for k in keep if d[k]) for r, d in zip(ranks, knobs,
                                                                              strict=True)]


def feasible_label(drawn: int, feasible: int) -> str:
    """The scatter's legend: how many feasible plans it draws of how many the search found
    (a GPU-count range keeps some rows of each count, and past MAX_POINTS an even sample is
    drawn: "feasible plans (20,081)" beside 167,324 found read as a miscount, user test 36)."""
    if drawn >= feasible:
        return f"feasible plans ({feasible:,})"
    return f"feasible plans: a sample of {drawn:,} of {feasible:,}"


def pareto_figure(plt: Any, result: SearchResult) -> str:
    """Throughput against cost (GPU-hours) when the GPU count varies, else against memory."""
    c, feas = result.scored.cols, np.flatnonzero(result.scored.feasible)
    found = max(result.scored.counts.get("feasible", 0), len(feas))
    if len(feas) > MAX_POINTS:  # a deterministic subsample, plus the ranked plans themselves
        feas = np.union1d(feas[np.linspace(0, len(feas) - 1, MAX_POINTS).astype(np.int64)],
                          result.order[:100])
    label = feasible_label(len(feas), found)
    tps = c["tokens_per_s"][feas]
    req = result.request
    if len(req.gpu_counts) > 1 or "cost" in req.targets.objectives:
        x = gpu_hours(tps, c["num_gpus"][feas], req.targets.cost_tokens)
        xlabel = f"GPU-hours for {req.targets.cost_tokens:.3g} tokens"
    else:
        x = c["mem_total"][feas] / GIB
        xlabel = "memory per GPU (GiB)"
    front = pareto_mask(np.stack([x, -tps], axis=1)) if len(feas) else np.zeros(0, bool)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.scatter(x, tps, s=4, alpha=0.3, color="tab:gray", label=label)
    order = np.argsort(x[front])
    ax.plot(x[front][order], tps[front][order], "o-", color="tab:red", label="Pareto front")
    if result.best is not None:
        b = int(result.best)
        bx = (gpu_hours(c["tokens_per_s"][b], c["num_gpus"][b], req.targets.cost_tokens)
              if xlabel.startswith("GPU") else c["mem_total"][b] / GIB)
        ax.scatter([bx], [c["tokens_per_s"][b]], s=120, marker="*", color="gold",
                   edgecolor="k", zorder=5, label="chosen plan (#1)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{req.model.name}: throughput against {xlabel.split(' (')[0]}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return data_uri(fig, plt)


def memory_figure(plt: Any, result: SearchResult, rows: np.ndarray, labels: list[str]) -> str:
    c = result.scored.cols
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.8))
    ys = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for part in MEMORY_PARTS:
        v = c[f"mem_{part}"][rows] / GIB
        if np.any(v > 0):
            ax.barh(ys, v, left=left, label=part)
            left += v
    cap = result.request.profile.device.memory_bytes / GIB
    ax.axvline(cap, color="k", ls="--", label=f"capacity {cap:.0f} GiB")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("GiB per GPU (worst pipeline stage)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return data_uri(fig, plt)


def small_series(result: SearchResult, rows: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The right-hand panel's parts, each named as what it is: without data parallelism
    `dp_comm` holds no gradient sync, so it gets its own label."""
    c = result.scored.cols
    dp1 = c["dp"][rows] == 1
    series = []
    for k, label in SMALL_PARTS:
        v = c[f"time_{k}"][rows]
        if k == "pp_comm" and result.request.model.tie_embeddings:
            label += " (+ tied-embedding all-reduce)"
        if k == "dp_comm":
            series += [(label, np.where(dp1, 0.0, v)), (DP1_LABEL, np.where(dp1, v, 0.0))]
        else:
            series.append((label, v))
    return series


def time_figure(plt: Any, result: SearchResult, rows: np.ndarray, labels: list[str]) -> str:
    """Two panels sharing the plans: compute (left) and everything else on its own axis."""
    c = result.scored.cols
    fig, (big, small) = plt.subplots(1, 2, sharey=True, figsize=(11, 0.45 * len(rows) + 2.0),
                                     gridspec_kw={"width_ratios": [1, 1.4]})
    ys = np.arange(len(rows))[::-1]
    colors = iter(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2)

    def stack(ax: Any, series: list[tuple[str, np.ndarray]]) -> None:
        left = np.zeros(len(rows))
        for label, v in series:
            color = next(colors)
            if np.any(v > 0):
                ax.barh(ys, v, left=left, label=label, color=color)
                left += v
        for y, total in zip(ys, left, strict=True):
            ax.text(total, y, f" {total:.3g} s", va="center", fontsize=7)

    stack(big, [(label, c[f"time_{k}"][rows]) for k, label in BIG_PARTS])
    stack(small, small_series(result, rows))
    big.set_yticks(ys, labels, fontsize=8)
    big.set_xlabel("compute (s / step)", fontsize=9)
    small.set_xlabel("communication, bubble, host (s / step, own scale)", fontsize=9)
    big.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0))
    small.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in (big, small):
        ax.margins(x=0.18)
    fig.tight_layout()
    return data_uri(fig, plt)
