"""What a search leaves behind: the summary object (--format json/yaml) and the --out directory
(plan.yaml, top.yaml, trials.csv, summary.json), written whole or not at all.

Files are written into a temporary sibling directory first and moved into place only when all
of them are complete; existing files are never replaced without --force.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.errors import ConfigError
from autoplan.plan import Plan, plan_to_dict, save_plan
from autoplan.search.engine import SearchResult
from autoplan.search.ranking import frame, row_plan
from autoplan.search.targets import Targets, miss_messages
from autoplan.yaml_io import dump_yaml, to_dict

log = logging.getLogger(__name__)
OUT_FILES = ("plan.yaml", "top.yaml", "trials.csv", "summary.json")


def plans(result: SearchResult, rows: np.ndarray) -> list[Plan]:
    req = result.request
    return [row_plan(result.scored, int(i), req.model, req.model_ref, req.profile_ref, req.space,
                     req.targets) for i in rows]


def top_rows(result: SearchResult, k: int) -> np.ndarray:
    """The ranked rows to show: the front (several objectives) or the best k."""
    if result.request.targets.multi:
        on_front = result.order[result.front[result.order]]
        return on_front[:max(k, 1)] if k else on_front
    return result.order[:k]


def nearest_info(result: SearchResult) -> dict[str, Any] | None:
    i = result.nearest
    if i is None:
        return None
    c, prof = result.scored.cols, result.request.profile
    row = {k: float(c[k][i]) for k in ("mem_total", "mem_host", "time_step", "tokens_per_s",
                                       "num_gpus")}
    misses = miss_messages(row, result.request.targets, prof.device.memory_bytes,
                           prof.host.memory_bytes, prof.gpus_per_node)
    plan = plans(result, np.array([i]))[0]
    return {"misses": misses, "plan": plan_to_dict(plan)}


def summary(result: SearchResult, top: int) -> dict[str, Any]:
    """The one object `--format json` prints and summary.json holds."""
    req, sc = result.request, result.scored
    rows = top_rows(result, top)
    ranked = frame(sc, rows, req.space, req.targets, result.front).to_dict(orient="records")
    counts = {k: v for k, v in sc.counts.items() if v}
    out: dict[str, Any] = {
        "feasible": bool(len(result.order)), "model": req.model.name,
        "cluster": req.profile_ref, "num_gpus": list(req.gpu_counts),
        "global_batch_size": req.global_batch_size, "space": req.space.name,
        "sampler": result.sampler, "objectives": list(req.targets.objectives),
        "targets": to_dict(req.targets), "seed": req.seed,
        "candidates": result.total, "scored": sc.n, "feasible_count": int(sc.feasible.sum()),
        "counts": counts, "seconds": result.seconds,
        "candidates_per_s": result.total / max(result.seconds, 1e-9),
        "top": [{k: to_dict(v) for k, v in r.items()} for r in ranked],
    }
    if result.best is not None:
        out["best"] = plan_to_dict(plans(result, np.array([result.best]))[0])
    if req.targets.multi:
        out["pareto_size"] = int(result.front.sum())
    near = nearest_info(result)
    if near is not None:
        out["nearest"] = near
    return out


def check_target(out: str | Path, force: bool) -> None:
    """Refuse an --out that is a file or already holds result files (unless --force)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{str(out)!r} is a file", "give a directory path")
    clash = [f for f in OUT_FILES if (out / f).exists()]
    if clash and not force:
        raise ConfigError("--out", f"{str(out)!r} already holds {', '.join(clash)}",
                          "choose another directory or pass --force")


def write_out(result: SearchResult, out: str | Path, top: int, force: bool,
              summary_data: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Write the result directory atomically (all files or none)."""
    out = Path(out)
    check_target(out, force)
    if result.best is None:
        raise ConfigError("--out", "nothing feasible to write", "relax the targets")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        req = result.request
        winner = plans(result, np.array([result.best]))[0]
        _cross_check(winner)
        save_plan(winner, tmp / "plan.yaml")
        top_plans = [plan_to_dict(p) for p in plans(result, top_rows(result, top))]
        (tmp / "top.yaml").write_text(dump_yaml({"schema_version": 1, "plans": top_plans}),
                                      encoding="utf-8")
        everything = np.concatenate([result.order, np.flatnonzero(~result.scored.feasible)])
        frame(result.scored, everything, req.space, req.targets, result.front).to_csv(
            tmp / "trials.csv", index_label="row")
        (tmp / "summary.json").write_text(
            json.dumps(to_dict(summary_data | (extra or {})), indent=2, default=str) + "\n",
            encoding="utf-8")
        out.mkdir(parents=True, exist_ok=True)
        umask = os.umask(0)
        os.umask(umask)
        for name in OUT_FILES:
            os.chmod(tmp / name, 0o666 & ~umask)  # mkstemp makes 0600 files
            os.replace(tmp / name, out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _cross_check(plan: Plan) -> None:
    """Warn when `autoplan estimate --plan` would judge the winner differently."""
    from autoplan.cost.estimate import estimate_plan

    est = estimate_plan(plan)
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
