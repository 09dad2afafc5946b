"""What the cost model's misses scale with: a diagnostic for the people who build the model.

For every scored row of the practitioner set and the measured sweeps (or --data FILES), the residual
is measured minus predicted step time, in seconds. Rows are grouped by source, GPU profile,
runtime and whether they recompute (the rows of one group ran one stack on one kind of machine),
and within each group the residual is regressed (least squares, with an intercept) on one
candidate at a time:

  predicted      the model's own step time: a uniform rate error (GEMM or attention efficiency,
                 clocks) grows with it
  microbatches   micro-batches per step on each pipeline: a fixed cost per micro-batch (host
                 work the device does not cover, a per-micro-batch synchronisation)
  block_passes   micro-batches x transformer blocks on one pipeline stage: a fixed cost per
                 block and micro-batch (per-layer host work, per-layer collectives' latency)
  tokens         tokens each GPU trains on per step: a per-token cost (data loading, loss)
  attention      the predicted step's attention-core share (by FLOPs): the attention kernel's
                 efficiency, which the profiles give per kernel (and on Hopper per length)

It prints, per group, each candidate's slope and R^2, and the pair of candidates that together
explain the most (two slopes and an intercept). The candidate that explains a group's
residuals says where to look (and what to measure on a GPU); it is never fed back into the cost
model, which takes its figures from datasheets, papers and measurements only.

Run: python benchmarks/residuals.py [--data FILE ...] [--min-rows N] [--format table|json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import practitioner  # noqa: E402  (the sibling script: its loader, plan builder and scorer)

from autoplan.cost.compute import attention_core_flops, model_flops_per_sequence  # noqa: E402
from autoplan.errors import ConfigError  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_FILES = (DATA / "practitioner.yaml", DATA / "mpt-llm-foundry.yaml",
                 DATA / "bloom-tr11-topology.yaml")
CANDIDATES = ("predicted", "microbatches", "block_passes", "tokens", "attention")
MIN_ROWS = 3
"""A line through 2 rows explains them whatever they are: a group needs 3 to say anything."""
PAIR_MIN_ROWS = 5
"""Two slopes and an intercept fit any 3 rows and leave 4 one degree of freedom: pairs from 5."""


def features(entry: dict[str, Any], predicted_s: float) -> dict[str, float]:
    """The candidates' values for one configuration, from its plan as autoplan builds it."""
    plan, model, cluster = practitioner.build(entry)
    batch, par = plan.batch, plan.parallel
    microbatches = batch.global_batch_size / (par.dp * batch.micro_batch_size)
    one = np.array(1.0)
    attention = 3.0 * model.num_layers * float(attention_core_flops(model, one, one, one))
    return {
        "microbatches": microbatches,
        "block_passes": microbatches * model.num_layers / par.pp,
        "tokens": batch.global_batch_size * model.seq_len / cluster.num_gpus,
        "attention": predicted_s * attention / model_flops_per_sequence(model),
    }


def fit(y: np.ndarray, *xs: np.ndarray) -> tuple[np.ndarray, float]:
    """(coefficients, R^2) of the least-squares fit y = a + b1 x1 + b2 x2 ...: coefficients
    [a, b1, b2, ...]. A candidate that does not vary gets slope 0 (nothing to explain with);
    R^2 is 0 where y does not vary (nothing to explain)."""
    y = np.asarray(y, float)
    cols = [np.asarray(x, float) for x in xs]
    varies = [len(c) > 1 and np.ptp(c) > 0.0 for c in cols]
    design = np.column_stack([np.ones_like(y)] + [c for c, v in zip(cols, varies, strict=True) if v])
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    full = np.zeros(len(cols) + 1)
    full[0] = coef[0]
    full[1:][np.array(varies, bool)] = coef[1:]
    total = float(np.sum((y - y.mean()) ** 2))
    resid = float(np.sum((y - design @ coef) ** 2))
    return full, (1.0 - resid / total) if total > 0.0 else 0.0


def rows(files: list[Path]) -> pd.DataFrame:
    """One row per scored configuration: its group keys, residual and candidates."""
    out = []
    for path in files:
        for entry in practitioner.load_data(path):
            if not entry.get("scored", True):
                continue
            scored = practitioner.score_entry(entry)
            if scored["error"] is None:
                continue
            out.append({
                "id": entry["id"], "source": entry["source"]["title"],
                "profile": scored["profile"], "runtime": entry["runtime"],
                "recompute": entry["plan"].get("recompute", {}).get("policy", "none") != "none",
                "measured": scored["measured_s"], "predicted": scored["predicted_s"],
                "residual": scored["measured_s"] - scored["predicted_s"],
                **features(entry, scored["predicted_s"])})
    return pd.DataFrame(out)


def explain(table: pd.DataFrame, min_rows: int) -> pd.DataFrame:
    """Per group of at least `min_rows` rows, each candidate's fit to the residuals."""
    out = []
    keys = ["source", "profile", "runtime", "recompute"]
    for key, group in table.groupby(keys, sort=True):
        if len(group) < min_rows:
            continue
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row.update(rows=len(group), mean_error=float((group.predicted / group.measured - 1).mean()))
        y = group.residual.to_numpy()
        for name in CANDIDATES:
            coef, r2 = fit(y, group[name].to_numpy())
            row[f"{name}_slope"], row[f"{name}_r2"] = float(coef[1]), r2
        row["best"] = max(CANDIDATES, key=lambda n: row[f"{n}_r2"])
        row.update(pair=None, pair_slopes=None, pair_r2=None)
        if len(group) >= PAIR_MIN_ROWS:
            pairs = [(a, b) for i, a in enumerate(CANDIDATES) for b in CANDIDATES[i + 1:]]
            scores = {p: fit(y, group[p[0]].to_numpy(), group[p[1]].to_numpy()) for p in pairs}
            pair = max(pairs, key=lambda p: scores[p][1])
            coef, r2 = scores[pair]
            row.update(pair=list(pair), pair_slopes=[float(coef[1]), float(coef[2])], pair_r2=r2)
        out.append(row)
    return pd.DataFrame(out)


UNITS = {"predicted": "s/s", "microbatches": "ms/mb", "block_passes": "ms/pass",
         "tokens": "us/ktok", "attention": "s/s"}
SCALE = {"predicted": 1.0, "microbatches": 1e3, "block_passes": 1e3, "tokens": 1e6 * 1e3,
         "attention": 1.0}


def print_table(found: pd.DataFrame) -> None:
    if found.empty:
        print("no group has enough rows")
        return
    for _, r in found.iterrows():
        print(f"\n{r.source} | {r.profile} | {r.runtime}"
              f"{' | recompute' if r.recompute else ''}: {r.rows} rows, mean error "
              f"{r.mean_error:+.1%}")
        for n in CANDIDATES:
            mark = "  <- best alone" if n == r.best else ""
            print(f"  {n:13} slope {r[n + '_slope'] * SCALE[n]:>+10.4g} {UNITS[n]:8} "
                  f"R^2 {r[n + '_r2']:.2f}{mark}")
        if r.pair is None:
            print(f"  (no pair: {PAIR_MIN_ROWS} rows or more needed)")
            continue
        slopes = ", ".join(f"{b * SCALE[n]:+.4g} {UNITS[n]}"
                           for n, b in zip(r.pair, r.pair_slopes, strict=True))
        print(f"  best pair: {' + '.join(r.pair)} ({slopes}), R^2 {r.pair_r2:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="+", default=list(DEFAULT_FILES))
    ap.add_argument("--min-rows", type=int, default=6,
                    help="leave out groups with fewer scored rows (default 6)")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    if args.min_rows < MIN_ROWS:
        sys.stderr.write(f"residuals: --min-rows {args.min_rows}: a line through fewer than "
                         f"{MIN_ROWS} rows fits them whatever they are; pass {MIN_ROWS} or more\n")
        return 2
    try:
        found = explain(rows(args.data), args.min_rows)
    except ConfigError as err:
        sys.stderr.write(f"residuals: {err}\n")
        return 2
    if args.format == "json":
        print(json.dumps({"groups": found.to_dict(orient="records")}, indent=2))
    else:
        print_table(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
