"""What a search leaves behind: the summary object (--format json/yaml) and the --out directory
(plan.yaml, top.yaml, trials.csv.gz, summary.json), written whole or not at all.

The directory is built as a temporary sibling and renamed into place only when every file is
complete (autoplan.fsutil); existing files are never replaced without --force.
"""

from __future__ import annotations

import gzip
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplan import fsutil
from autoplan.cli_common import finite, json_text
from autoplan.errors import ConfigError
from autoplan.plan import Plan
from autoplan.plan_files import load_plan, plan_to_dict
from autoplan.search.engine import SearchResult, kept_rows
from autoplan.search.exportable import export_refusals
from autoplan.search.nearest import row_capacities
from autoplan.search.ranking import frame, row_plan
from autoplan.search.scoring import Scored
from autoplan.search.targets import MISS_KEYS, Targets
from autoplan.yaml_io import dump_yaml, to_dict

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
OUT_FILES = ("plan.yaml", "top.yaml", "trials.csv.gz", "summary.json")
"""trials.csv.gz: the scored candidates that can matter (engine.kept_rows: the best 2,000 by the
ranking and by each objective, the Pareto front, the 2,000 nearest misses), gzip-compressed
(pandas.read_csv and zcat read it); with --all-trials every scored candidate (a 16-GPU
Qwen3-30B-A3B search scored 1.3M: 99.5 MB, and its write doubled the search's time).
summary.json `trials_csv_rows` counts what it holds."""


def plans(result: SearchResult, rows: np.ndarray) -> list[Plan]:
    """The rows as Plans, each naming its own profile (several with --cluster A,B)."""
    req, sc = result.request, result.scored
    names = sc.clusters or (req.profile_ref,)
    where = sc.cols.get("cluster", np.zeros(sc.n, dtype=np.int64))
    return [row_plan(sc, int(i), req.model, req.model_ref, names[int(where[i])], req.space,
                     req.targets) for i in rows]


def top_rows(result: SearchResult, k: int) -> np.ndarray:
    """The ranked rows to show: the front (several objectives) or the best k."""
    if result.request.targets.multi:
        on_front = result.order[result.front[result.order]]
        return on_front[:max(k, 1)] if k else on_front
    return result.order[:k]


def nearest_info(result: SearchResult) -> dict[str, Any] | None:
    """The nearest miss as plain data: its reason, what it misses, and the plan (None when no
    candidate is a plan, e.g. no layout fills the GPU count)."""
    miss = result.miss
    if miss is None:
        return None
    plan = plans(result, np.array([miss.row]))[0] if miss.row is not None else miss.plan
    return {"reason": miss.reason, "misses": list(miss.misses),
            "plan": plan_to_dict(plan) if plan is not None else None}


def summary(result: SearchResult, top: int) -> dict[str, Any]:
    """The one object `--format json` prints and summary.json holds."""
    req, sc = result.request, result.scored
    rows = top_rows(result, top)
    ranked = frame(sc, rows, req.space, req.targets, result.front,
                   row_capacities(req, sc)).to_dict(orient="records")
    counts = {k: v for k, v in sc.counts.items() if v}
    out: dict[str, Any] = {
        "feasible": bool(len(result.order)), "model": req.model.name,
        "cluster": req.profile_ref, "num_gpus": list(req.gpu_counts),
        # --num-gpus typed as A..B (num_gpus: the counts of it searched); absent for a list
        **({"num_gpus_range": list(req.gpu_range)} if req.gpu_range else {}),
        # an `--objective gpus` search stops at the first count that meets the targets
        "num_gpus_scored": list(result.counts_scored or req.gpu_counts),
        "global_batch_size": req.global_batch_size,
        # its tokens a step at the model's seq_len as searched (a range: its low end's)
        "global_batch_tokens": req.global_batch_size * req.model.seq_len}
    lo, hi = req.batch
    if hi != lo:  # the search picked the batch in [lo, hi]; each plan names its own
        out["global_batch_range"] = [lo, hi]
    out |= {
        "space": req.space.name,
        # what was searched: the space's list or --precision, `auto` settled for the device
        "precisions": [p.value for p in req.space.precision], "runtime": sc.runtime,
        "sampler": result.sampler,
        # a sampled search: the space each GPU type drew from, against max_enumerate
        **({"sampled_space": [s.to_dict() for s in result.sampled], "trials": req.trials}
           if result.sampled else {}),
        "objectives": list(req.targets.objectives),
        "targets": to_dict(req.targets), "seed": req.seed,
        # over every candidate scored (counts), not only the rows a GPU-count range kept
        "candidates": result.total, "scored": scored_total(sc.counts),
        "feasible_count": sc.counts.get("feasible", 0), "kept": sc.n,
        "counts": counts, "seconds": result.seconds,
        "candidates_per_s": result.total / max(result.seconds, 1e-9),
        # null, not NaN, where a figure does not exist (dollars of an unpriced profile)
        "top": [finite({k: to_dict(v) for k, v in r.items()}) for r in ranked],
    }
    if result.best is not None:
        out["best"] = plan_to_dict(plans(result, np.array([result.best]))[0])
    exportable = export_refusals(result)
    if exportable is not None:  # the runtime's --to target: [] where it writes the winner
        out["export"] = exportable
    if req.targets.multi:
        out["pareto_size"] = int(result.front.sum())
    near = nearest_info(result)
    if near is not None:
        out["nearest"] = near
    return out


def scored_total(counts: dict[str, int]) -> int:
    """Candidates that got a prediction: the feasible ones and those that miss memory or a
    target (every other reason rejects a candidate before it is scored)."""
    return counts.get("feasible", 0) + sum(counts.get(k, 0) for k in MISS_KEYS)


def check_target(out: str | Path, force: bool, names: tuple[str, ...] = OUT_FILES) -> None:
    """Refuse, before any work, an --out that is a file, lies under one, cannot be written,
    or already holds result files (unless --force)."""
    fsutil.check_dir_target(out, force=force, names=names, field="--out")


LARGE_CSV_ROWS = 500_000
"""Rows from which write_out says it is writing trials.csv.gz: a 3.6M-row CSV took minutes after
search said it was done, in silence (pandas' float formatting, then gzip). Level 3 compresses it
3x faster than gzip's default 9 (4.8 s against 12.1 s on 330 MB of a 64-GPU 70B search's CSV,
54 MB against 44)."""


def csv_kept(result: SearchResult, top: int = 0) -> np.ndarray:
    """The rows trials.csv.gz holds without --all-trials: engine.kept_rows of each GPU count
    (and type), as a range scored count by count keeps them, so the file holds the same rows
    whether the counts were scored together or apart; and the `top` ranked first (a --top
    above KEEP_PER_COUNT lists them in top.yaml)."""
    sc = result.scored
    cols = sc.cols
    groups = np.asarray(cols["num_gpus"], dtype=np.int64) * 1024 + (
        np.asarray(cols["cluster"], dtype=np.int64) if "cluster" in cols else 0)
    keep = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        part = Scored({k: np.asarray(v)[idx] for k, v in cols.items()}, sc.counts, sc.runtime,
                      sc.clusters)
        keep.append(idx[kept_rows(part, result.request.targets)])
    keep.append(np.asarray(result.order[:top], dtype=np.int64))
    return np.concatenate(keep)


def write_out(result: SearchResult, out: str | Path, top: int, force: bool,
              summary_data: dict[str, Any], extra: dict[str, Any] | None = None,
              also: Callable[[Path], None] | None = None,
              names: tuple[str, ...] = OUT_FILES, stale: tuple[str, ...] = (),
              all_trials: bool = False) -> Path:
    """Write the result directory atomically (all files or none): built as a temporary
    sibling, renamed into place (fsutil.atomic_dir). `also(tmp)` adds files to the same
    directory before it is renamed (the report, when it goes into --out). `stale`: files of
    an earlier result this one does not write (its report.html), removed under force so the
    directory never holds parts of two searches."""
    if result.best is None:
        raise ConfigError("--out", "nothing feasible to write", "relax the targets")
    req = result.request
    with fsutil.atomic_dir(out, force=force, names=names, field="--out", stale=stale) as tmp:
        winner = plans(result, np.array([result.best]))[0]
        _cross_check(winner)
        fsutil.write_text(tmp / "plan.yaml", dump_yaml(plan_to_dict(winner)))
        if load_plan(tmp / "plan.yaml") != winner:  # every save reloads and compares
            raise AssertionError("plan.yaml does not reload equal")
        top_plans = [plan_to_dict(p) for p in plans(result, top_rows(result, top))]
        fsutil.write_text(tmp / "top.yaml", dump_yaml({"schema_version": 1, "plans": top_plans}))
        everything = np.concatenate([result.order, np.flatnonzero(~result.scored.feasible)])
        if not all_trials:  # ranked order first, as before
            everything = everything[np.isin(everything, csv_kept(result, top))]
        if len(everything) >= LARGE_CSV_ROWS:  # a minute or more after "done": say why
            sys.stderr.write(f"search: writing {len(everything):,} rows to trials.csv.gz\n")
            sys.stderr.flush()
        csv = csv_words(frame(result.scored, everything, req.space, req.targets,
                              result.front, row_capacities(req, result.scored))).to_csv(
            index_label="row")
        fsutil.write_bytes(tmp / "trials.csv.gz",
                           gzip.compress(csv.encode("utf-8"), compresslevel=3, mtime=0))
        fsutil.write_text(tmp / "summary.json", json_text(
            summary_data | (extra or {}) | {"trials_csv_rows": len(everything)}) + "\n")
        if also is not None:
            also(tmp)
    return Path(out)


CSV_WORDS = {"dp_shard": (0, "off"), "grad_reduce": ("", "default")}
"""trials.csv.gz's words for a plan's null, where a number or an empty cell (NaN to pandas)
said nothing (user test 36): dp_shard `off` (no HSDP: ZeRO shards over all of dp, a plan's
`parallel.dp_shard: null`), grad_reduce `default` (the runtime's own reduce dtype, a plan's
`grad_reduce_dtype: null`)."""


def csv_words(df: pd.DataFrame) -> pd.DataFrame:
    """The frame with CSV_WORDS in place of the values that stand for a plan's null."""
    for column, (null, word) in CSV_WORDS.items():
        if column in df:
            values = df[column].astype(object)
            df[column] = values.where(values != null, word)
    return df


def _cross_check(plan: Plan) -> None:
    """Warn when `autoplan estimate --plan` would judge the winner differently."""
    from autoplan.cost.estimate import estimate_plan

    est = estimate_plan(plan, runtime=(plan.predicted or {}).get("runtime") or None)
    predicted = (plan.predicted or {}).get("tokens_per_s")
    if not est.feasible or (predicted and abs(est.tokens_per_s / predicted - 1.0) > 1e-6):
        log.warning("estimate_plan scores the winner differently (%s, %.0f tokens/s vs %.0f "
                    "predicted)%s", "; ".join(est.reasons) or "feasible", est.tokens_per_s,
                    predicted or 0.0, " - uneven split: plan_table.plan_to_row has no "
                    "layers_last" if plan.pipeline.layers_per_stage else "")


def targets_line(t: Targets) -> str:
    parts = [f"objective {','.join(t.objectives)}"]
    for name in ("max_step_time_s", "min_tokens_per_s", "deadline_days", "train_tokens"):
        if getattr(t, name) is not None:
            parts.append(f"{name.replace('_', '-')} {getattr(t, name):g}")
    return "; ".join(parts)
