"""`--report`: one self-contained HTML page of a search (figures inline as base64 PNG): the run's
inputs, why the winner wins, the ranked table, the Pareto front, memory and time per plan, and
what was rejected and why.

matplotlib is optional (`pip install autoplan[report]`) and imported only here, lazily.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.errors import ConfigError
from autoplan.search.engine import SearchRequest, SearchResult
from autoplan.search.nearest import row_capacities
from autoplan.search.notes import fold_note
from autoplan.search.output import csv_words, scored_total, top_rows
from autoplan.search.ranking import frame
from autoplan.search.render import counts_text
from autoplan.search.rows import Shown, collapse, with_band, zero_cell
from autoplan.search.table import COLUMNS, HOISTABLE, legend
from autoplan.yaml_io import to_dict

log = logging.getLogger(__name__)
REPORT_FILES = ("report.html",)
GIB = 2**30
STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1150px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{padding:2px 8px;
border-bottom:1px solid #ddd;text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.best{background:#fff7d6}img{max-width:100%;border:1px solid #eee}p.note{color:#555;
font-size:13px}h2{margin-top:1.6em;border-bottom:1px solid #ccc}code{background:#f5f5f5}"""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError("--report", "needs matplotlib",
                          "pip install 'autoplan[report]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def esc(text: Any) -> str:
    return html.escape(str(text))


def table_html(headers: list[str], rows: list[list[str]],
               left: frozenset[int] | set[int] = frozenset(), best: int | None = None) -> str:
    head = "".join(f"<th class='{'l' if j in left else ''}'>{esc(h)}</th>"
                   for j, h in enumerate(headers))
    body = "".join(
        f"<tr{' class=best' if k == best else ''}>" + "".join(
            f"<td class='{'l' if j in left else ''}'>{esc(v)}</td>" for j, v in enumerate(r))
        + "</tr>" for k, r in enumerate(rows))
    return f"<table><tr>{head}</tr>{body}</table>"


def shown_plans(result: SearchResult, top: int) -> tuple[list[Shown], np.ndarray]:
    """The ranked plans as table rows and their row indexes: the plans summary.json keeps
    (output.top_rows) as the terminal table shows them (rows.shown_rows: equivalent ones merged,
    slower recompute variants folded into their plan's row); never one ranked below them."""
    from autoplan.search.ranking import frame

    req = result.request
    idx = top_rows(result, top)
    records = frame(result.scored, idx, req.space, req.targets, result.front,
                    row_capacities(req, result.scored)).to_dict("records")
    records = [with_band(r) | {"_row": int(i)} for r, i in zip(records, idx, strict=True)]
    shown = collapse(records, top, fold=True)
    return shown, np.array([s.row["_row"] for s in shown], dtype=np.int64)


def inputs_html(result: SearchResult) -> str:
    req, m, prof = result.request, result.request.model, result.request.profile
    counts = result.scored.counts
    gpus = counts_text(list(req.gpu_counts), req.gpu_range)
    rows = [
        ["model", f"{m.name}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads "
                  f"({m.kv_heads} K/V), ffn {m.ffn}, vocab {m.vocab_size}, sequence {m.seq_len}"],
        ["cluster", f"{req.profile_ref}: {prof.device.name}, "
                    f"{prof.device.memory_bytes / GIB:.0f} GiB, {prof.gpus_per_node} GPUs per node"
                    + (" (measured profile)" if prof.measured is not None else " (datasheet)")],
        ["GPUs", gpus], ["global batch", f"{batch_text(req)} sequences"],
        ["space", req.space.name], ["sampler", sampler_text(result)],
        ["targets", "; ".join(f"{k.replace('_', ' ')} "
                              f"{', '.join(map(str, v)) if isinstance(v, list) else v}"
                              for k, v in to_dict(req.targets).items() if v not in (None, [], ()))],
        ["candidates", f"{result.total:,} ({scored_total(counts):,} scored, "
                       f"{counts.get('feasible', 0):,} feasible"
                       + (f", {result.scored.n:,} kept" if result.scored.n < scored_total(counts)
                          else "") + f") in {result.seconds:.2f} s"],
    ]
    return table_html(["input", "value"], rows, left={0, 1})


def sampler_text(result: SearchResult) -> str:
    """"exhaustive (seed 0)"; a sampled search adds its trials and the space it drew from, as
    the terminal header says it (sampled.sampled_text): "tpe (seed 0, 300 trials; the space's
    6,992,568 candidates exceed max_enumerate 5,000,000)", "random (seed 0, 300 trials of the
    space's 6,992,568 candidates)"."""
    from autoplan.search.sampled import sampled_text

    req = result.request
    if result.sampler == "exhaustive":
        return f"exhaustive (seed {req.seed})"
    space = sampled_text([s.to_dict() for s in result.sampled], "," in req.profile_ref)
    joint = "" if not space else f" {space}" if space.startswith("of ") else f"; {space}"
    return f"{result.sampler} (seed {req.seed}, {req.trials:,} trials{joint})"


def batch_text(req: SearchRequest) -> str:
    """The global batch as asked: one size, or the range the search picked from."""
    lo, hi = req.batch
    return f"{lo}" if hi == lo else f"{lo}..{hi}"


def ranked_html(result: SearchResult, shown: list[Shown], fold: str | None = None) -> str:
    """Every column in full, except those all rows share: those are named once above it; under
    it the legend and `fold`, the terminal's line on what its rows fold (notes.fold_note)."""
    objectives = list(result.request.targets.objectives)
    cols, shared = [], []
    for c in COLUMNS:
        if (c[0] == "gpu_hours" and "cost" not in objectives) or (
                c[0] == "num_gpus" and len(result.request.gpu_counts) == 1):
            continue
        values = {c[4](s, True) for s in shown}
        if len(values) == 1 and (c[0] in HOISTABLE or values == {"-"}):
            if values != {"-"} or c[0] in HOISTABLE:
                shared.append(f"{c[1]} {values.pop()}")
            continue
        cols.append(c)
    rows = [[c[4](s, True) for c in cols] for s in shown]
    left = {j for j, c in enumerate(cols) if not c[3]}
    note = f"<p>Every plan below: {esc(', '.join(shared))}.</p>" if shared else ""
    return (note + table_html([c[1] for c in cols], rows, left, best=0)
            + f"<p class=note>{esc(legend(shown, wide=True, headers={c[1] for c in cols}))}</p>"
            + (f"<p class=note>{esc(fold)}</p>" if fold else ""))


REJECTED_ALWAYS = ("dp", "tp", "pp", "cp", "vpp", "zero", "mbs")
"""Knobs every rejected plan names; the others only where the rows shown differ in them."""
REJECTED_IF_DIFFERENT = ("num_gpus", "cluster", "ep", "etp", "dp_shard", "sp", "schedule",
                         "split", "recompute", "recompute_layers", "offload_optimizer",
                         "offload_params", "precision", "attention", "grad_reduce", "gbs")


def rejected_words(result: SearchResult, rows: np.ndarray) -> list[str]:
    """Each row's plan in a few words: the layout, every other knob in which the rows differ
    (eight rows of one layout that missed by ep or precision read alike: user test 35), and
    the precision and GPU type wherever the search had several."""
    req = result.request
    # the same words as trials.csv.gz for a plan's nulls (dp_shard off, grad_reduce default)
    df = csv_words(frame(result.scored, rows, req.space, req.targets))
    if "recompute_layers" in df:  # one word: none, or policy:layers (-1: every layer)
        df["recompute"] = [r if r == "none" else f"{r}:{'all' if n < 0 else n}"
                           for r, n in zip(df["recompute"], df["recompute_layers"],
                                           strict=True)]
        df = df.drop(columns="recompute_layers")
    # the precision and GPU type whenever the search had several: eight fp8 rows of a
    # bf16+fp8 search read as if precision played no part (user test 36)
    searched = {"precision": len(req.space.precision) > 1, "cluster": len(req.types) > 1}
    names = [k for k in REJECTED_ALWAYS if k in df] + [
        k for k in REJECTED_IF_DIFFERENT
        if k in df and (searched.get(k) or df[k].astype(str).nunique() > 1)]
    return [" ".join(f"{k}{r[k]}" if k in REJECTED_ALWAYS else f"{k}={r[k]}" for k in names)
            for _, r in df.iterrows()]


def rejected_html(result: SearchResult) -> str:
    """Counts by first reason, then the fastest scored plans that missed, with what they miss."""
    counts = {k: v for k, v in result.scored.counts.items() if v}
    total = max(result.total, 1)
    out = table_html(["outcome (first reason)", "candidates", "share"],
                     [[k, f"{v:,}", f"{v / total:.1%}"] for k, v in
                      sorted(counts.items(), key=lambda kv: -kv[1])], left={0})
    c = result.scored.cols
    missed = np.flatnonzero(~result.scored.feasible)
    if len(missed):
        from autoplan.search.targets import MISS_KEYS, device_need

        fastest = missed[np.argsort(-c["tokens_per_s"][missed], kind="stable")][:8]
        # each row's own GPU type; what it must fit (the p75 slack under --memory-slack p75)
        cap = row_capacities(result.request, result.scored) / GIB
        need = device_need(c, result.request.targets) / GIB
        words = rejected_words(result, fastest)
        rows = [[words[k], f"{c['tokens_per_s'][i]:,.0f}", f"{need[i]:.1f} of {cap[i]:.0f}",
                 MISS_KEYS[int(c["reason"][i])] if c["reason"][i] >= 0 else "?"]
                for k, i in enumerate(fastest)]
        out += ("<p>The fastest plans that were scored and rejected (they would have ranked "
                "first):</p>" + table_html(["plan", "tokens/s", "GiB per GPU", "rejected for"],
                                           rows, left={0, 3}))
    return out


def page(result: SearchResult, top: int, plt: Any) -> str:
    from autoplan.search import report_plots as rp
    from autoplan.search.baseline import note_lines, why_lines

    req = result.request
    title = (f"{req.model.name} on {req.profile_ref}, global batch {batch_text(req)}: "
             f"{result.sampler} search")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1>",
             "<h2>Inputs</h2>", inputs_html(result)]
    if result.best is None:
        parts += ["<h2>No feasible plan</h2>", rejected_html(result), "</body></html>"]
        return "\n".join(parts)
    shown, rows = shown_plans(result, top)
    fold = fold_note(result, shown, len(top_rows(result, top)), top)
    labels = [label.replace(f"zero{s.zeros[0]}", f"zero{zero_cell(s)}") for label, s in
              zip(rp.plan_labels(result, rows, [s.rank for s in shown]), shown, strict=True)]
    why = why_lines(result, {}, shown)
    if why:  # the same lines as under the terminal's table (a throughput or latency ranking)
        parts += ["<h2>Why this plan</h2>", "".join(f"<p>{esc(w)}</p>" for w in why)]
    notes = note_lines(result, shown)
    if notes:  # under any ranking: an unvalidated MFU, an export target that refuses it
        parts += ["<h2>Notes on plan #1</h2>", "".join(f"<p>{esc(n)}</p>" for n in notes)]
    parts += ["<h2>Ranked plans</h2>", ranked_html(result, shown, fold),
              "<h2>Pareto front</h2>",
              f"<img alt='Pareto front' src='{rp.pareto_figure(plt, result)}'>",
              "<h2>Memory per GPU</h2>",
              f"<img alt='memory per plan' src='{rp.memory_figure(plt, result, rows, labels)}'>",
              "<h2>Where the step time goes</h2>",
              "<p class=note>Split axis: compute on the left, everything else on the right "
              "with its own scale.</p>",
              f"<img alt='time per plan' src='{rp.time_figure(plt, result, rows, labels)}'>",
              "<h2>Rejected candidates</h2>", rejected_html(result), "</body></html>"]
    return "\n".join(parts)


def write_report(result: SearchResult, out: str | Path, top: int, force: bool) -> Path:
    """Write `out/report.html` (whole or not at all); returns its path."""
    from autoplan import fsutil

    plt = _pyplot()
    path = Path(out) / "report.html"
    fsutil.check_file_target(path, force=force, field="--report")
    return fsutil.write_text(path, page(result, top, plt), force=force, field="--report")
