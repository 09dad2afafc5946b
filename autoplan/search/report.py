"""`--report`: PNG plots of a search (Pareto front, memory breakdown and time breakdown of the
top plans) and a small HTML page holding them.

matplotlib is optional (`pip install autoplan[report]`) and imported only here, lazily.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.cost.estimate import MEMORY_PARTS, TIME_PARTS
from autoplan.errors import ConfigError
from autoplan.search.engine import SearchResult
from autoplan.search.output import top_rows
from autoplan.search.pareto import pareto_mask
from autoplan.search.targets import gpu_hours

log = logging.getLogger(__name__)
REPORT_FILES = ("pareto.png", "memory.png", "time.png", "report.html")
GIB = 2**30
MAX_POINTS = 20_000
"""Feasible candidates drawn in the scatter (a deterministic subsample beyond this)."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError("--report", "needs matplotlib",
                          "pip install 'autoplan[report]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(result: SearchResult, i: int) -> str:
    c = result.scored.cols
    return (f"dp{c['dp'][i]} tp{c['tp'][i]} pp{c['pp'][i]}"
            + (f" cp{c['cp'][i]}" if c["cp"][i] > 1 else "")
            + (f" ({c['num_gpus'][i]} GPUs)" if len(result.request.gpu_counts) > 1 else ""))


def plot_pareto(plt: Any, result: SearchResult, path: Path) -> None:
    """Throughput against cost (GPU-hours) when the GPU count varies, else against memory."""
    c, feas = result.scored.cols, np.flatnonzero(result.scored.feasible)
    if len(feas) > MAX_POINTS:
        feas = feas[np.linspace(0, len(feas) - 1, MAX_POINTS).astype(np.int64)]
    tps = c["tokens_per_s"][feas]
    if len(result.request.gpu_counts) > 1 or "cost" in result.request.targets.objectives:
        x = gpu_hours(tps, c["num_gpus"][feas], result.request.targets.cost_tokens)
        xlabel = f"GPU-hours for {result.request.targets.cost_tokens:.3g} tokens"
    else:
        x = c["mem_total"][feas] / GIB
        xlabel = "memory per GPU (GiB)"
    front = pareto_mask(np.stack([x, -tps], axis=1)) if len(feas) else np.zeros(0, bool)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(x, tps, s=4, alpha=0.3, color="tab:gray", label="feasible plans")
    order = np.argsort(x[front])
    ax.plot(x[front][order], tps[front][order], "o-", color="tab:red", label="Pareto front")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{result.request.model.name}: throughput vs {xlabel.split(' (')[0]}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stacked(plt: Any, result: SearchResult, rows: np.ndarray, parts: tuple[str, ...],
             prefix: str, scale: float, ylabel: str, title: str, path: Path) -> None:
    c = result.scored.cols
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows) + 3), 4.5))
    bottom = np.zeros(len(rows))
    xs = np.arange(len(rows))
    for part in parts:
        v = c[f"{prefix}{part}"][rows] / scale
        if np.any(v > 0):
            ax.bar(xs, v, bottom=bottom, label=part)
            bottom += v
    if prefix == "mem_":
        ax.axhline(result.request.profile.device.memory_bytes / scale, color="k", ls="--",
                   label="capacity")
    ax.set_xticks(xs, [f"#{k + 1}\n{_label(result, i)}" for k, i in enumerate(rows)],
                  fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _page(result: SearchResult) -> str:
    req = result.request
    best = result.best
    head = html.escape(f"{req.model.name} on {req.profile_ref}, GPUs "
                       f"{', '.join(map(str, req.gpu_counts[:8]))}"
                       f"{'...' if len(req.gpu_counts) > 8 else ''}, global batch "
                       f"{req.global_batch_size}: {result.sampler} search")
    line = ""
    if best is not None:
        c = result.scored.cols
        line = html.escape(f"best: {_label(result, best)}, {c['tokens_per_s'][best]:,.0f} "
                           f"tokens/s, MFU {c['mfu'][best]:.1%}, "
                           f"{c['mem_total'][best] / GIB:.1f} GiB per GPU")
    figs = "\n".join(f'<h2>{title}</h2><img src="{name}" alt="{title}">' for name, title in (
        ("pareto.png", "Pareto front"), ("memory.png", "Memory per GPU of the top plans"),
        ("time.png", "Where the step time goes")))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>autoplan search</title>"
            f"</head><body><h1>{head}</h1><p>{line}</p>{figs}</body></html>\n")


def write_report(result: SearchResult, out: str | Path, top: int, force: bool) -> Path:
    """Write the plots and the page into `out` (all or nothing); returns the HTML path."""
    plt = _pyplot()
    out = Path(out)
    clash = [f for f in REPORT_FILES if (out / f).exists()]
    if clash and not force:
        raise ConfigError("--report", f"{str(out)!r} already holds {', '.join(clash)}",
                          "choose another directory or pass --force")
    rows = top_rows(result, top)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".report.", dir=out))
    try:
        plot_pareto(plt, result, tmp / "pareto.png")
        _stacked(plt, result, rows, MEMORY_PARTS, "mem_", GIB, "GiB per GPU",
                 "memory per GPU (worst stage)", tmp / "memory.png")
        _stacked(plt, result, rows, TIME_PARTS, "time_", 1.0, "seconds per step",
                 "step time by part", tmp / "time.png")
        (tmp / "report.html").write_text(_page(result), encoding="utf-8")
        for name in REPORT_FILES:
            os.chmod(tmp / name, 0o644)
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "report.html"
