"""Order scored candidates, turn rows into Plans and into the display/CSV frame.

Single objective: best value first, ties broken by the shorter step, lower memory, then
candidate order (so runs are reproducible). Several objectives: the Pareto front, ordered by the first objective.
pandas appears only here, for the final table and the CSV.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from autoplan import resources
from autoplan.cost import memory
from autoplan.cost.error_band import above_ceiling
from autoplan.cost.estimate import TIME_PARTS, row_estimate
from autoplan.model_spec import ModelSpec
from autoplan.plan import ClusterRef, Pipeline, Plan
from autoplan.plan_table import (
    RC_UNIFORM,
    RECOMPUTE,
    REDUCE_DTYPES,
    SCHEDULES,
    expert_col,
    mask_modules,
    row_to_plan,
)
from autoplan.search.pareto import pareto_mask
from autoplan.search.partition import stage_layers
from autoplan.search.scoring import Scored
from autoplan.search.targets import MISS_KEYS, Targets, display_value, gpu_hours
from autoplan.search_space import SearchSpace, Split

if TYPE_CHECKING:
    import pandas as pd

GIB = 2**30


def rank(scored: Scored, targets: Targets) -> tuple[np.ndarray, np.ndarray]:
    """(ranked row indexes of the feasible candidates, Pareto-front mask over all rows)."""
    c = scored.cols
    feas = np.flatnonzero(scored.feasible)
    obj = c["objectives"][feas]
    front = np.zeros(scored.n, dtype=bool)
    if len(feas):
        front[feas[pareto_mask(obj)]] = True
    # ties: the faster plan (matters for the gpus objective), then the one using less memory
    keys = [feas, c["mem_total"][feas], c["time_step"][feas]] \
        + [obj[:, j] for j in range(obj.shape[1])][::-1]
    if targets.multi:
        keys.append(~front[feas])  # front first
    order = feas[np.lexsort(keys)]
    return order, front


def nearest(scored: Scored) -> int | None:
    """The valid candidate closest to working: among those that fit in memory, the one that
    misses its targets by the smallest margin; if none fits, the one short of the least memory."""
    if scored.n == 0:
        return None
    miss = scored.cols["miss"]
    memory = np.max(miss[:, :2], axis=1)
    fits = memory <= 0
    if fits.any():
        worst = np.where(fits, np.max(miss[:, 2:], axis=1), np.inf)
        return int(np.argmin(worst))
    return int(np.argmin(memory))


def row_plan(scored: Scored, i: int, model: ModelSpec, model_ref: str | ModelSpec,
             profile_ref: str, space: SearchSpace, targets: Targets) -> Plan:
    """Row i as a Plan carrying its prediction."""
    c = scored.cols
    plan = row_to_plan(c, i, model_ref, ClusterRef(resources.plan_profile_ref(profile_ref),
                                                    int(c["num_gpus"][i])),
                       space.precision[int(c["precision"][i])])
    plan = plan.replace(attention=space.attention[int(c["attention"][i])])
    split = list(Split)[int(c["split"][i])]
    if split is not Split.EVEN:  # the uneven split the row's layer columns priced
        lps = stage_layers(model, plan.parallel.pp, plan.pipeline.vpp, split.value)
        plan = plan.replace(pipeline=Pipeline(plan.pipeline.schedule, plan.pipeline.vpp, lps))
    return plan.replace(predicted=predicted(scored, i, targets))


def predicted(scored: Scored, i: int, targets: Targets) -> dict[str, Any]:
    est = row_estimate(scored.cols, i)
    out: dict[str, Any] = {
        "tokens_per_s": est["tokens_per_s"], "step_time_s": est["time"]["step"],
        "mfu": est["mfu"], "hfu": est["hfu"], "memory_bytes": est["memory"],
        "time_s": est["time"], "dominant": est["dominant"],
        "runtime": scored.runtime, "error_band": est["band"], "error_bias": est["bias"],
    }
    for j, name in enumerate(targets.objectives):
        out[f"objective_{name}"] = display_value(name, float(scored.cols["objectives"][i, j]))
    if targets.train_tokens is not None:
        out["days_to_train"] = targets.train_tokens / est["tokens_per_s"] / 86400.0
        out["gpu_hours"] = float(gpu_hours(est["tokens_per_s"], scored.cols["num_gpus"][i],
                                           targets.train_tokens))
        price = float(scored.cols.get("price_per_gpu_hour", np.array([np.nan] * scored.n))[i])
        if np.isfinite(price):
            out["usd"] = out["gpu_hours"] * price
            out["price_per_gpu_hour"] = price
    return out


def recompute_names(c: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Each row's recompute as shown: the policy, selective(core_attn+layernorm) for module
    sets (no square brackets: rich reads them as markup), full-uniform for the uniform method
    (the :N after it is its group size)."""
    names = np.array([r.value for r in RECOMPUTE], dtype=object)[c["recompute"][rows]]
    if "rc_modules" not in c:
        return names.astype(str)
    for j, (mask, method) in enumerate(zip(c["rc_modules"][rows], c["rc_method"][rows],
                                           strict=True)):
        if mask:
            names[j] = f"{names[j]}({'+'.join(m.value for m in mask_modules(int(mask)) or ())})"
        elif method == RC_UNIFORM:
            names[j] = f"{names[j]}-uniform"
    return names.astype(str)


def frame(scored: Scored, rows: np.ndarray, space: SearchSpace, targets: Targets,
          front: np.ndarray | None = None, capacity: np.ndarray | None = None) -> pd.DataFrame:
    """One line per row: every knob, memory, time, throughput, MFU, dominant cost, status;
    with `capacity` (each scored row's GPU memory, bytes), `mem_tight_gib`: what a plan that
    fits would miss it by at the allocator's 75th-percentile slack (memory.tight_by_bytes)."""
    import pandas as pd

    rows = np.asarray(rows, dtype=np.int64)
    c = scored.cols if scored.n else _empty_columns(scored.cols)
    reason = c["reason"][rows]
    data: dict[str, Any] = {
        "num_gpus": c["num_gpus"][rows], "dp": c["dp"][rows], "tp": c["tp"][rows],
        "pp": c["pp"][rows], "cp": c["cp"][rows], "sp": c["sp"][rows],
        "schedule": np.array([s.value for s in SCHEDULES])[c["schedule"][rows]],
        "vpp": c["vpp"][rows],
        "ep": expert_col(c, "ep")[rows], "etp": expert_col(c, "etp")[rows],
        "split": np.array([s.value for s in Split])[c["split"][rows]],
        "zero": c["zero_stage"][rows], "offload_optimizer": c["offload_optimizer"][rows],
        "offload_params": c["offload_params"][rows],
        "recompute": recompute_names(c, rows),
        "recompute_layers": c["recompute_layers"][rows], "mbs": c["mbs"][rows],
        "precision": np.array([p.value for p in space.precision])[c["precision"][rows]],
        "attention": np.array([a.value for a in space.attention])[c["attention"][rows]],
        "mem_gib": c["mem_total"][rows] / GIB, "host_gib": c["mem_host"][rows] / GIB,
        "step_s": c["time_step"][rows], "tokens_per_s": c["tokens_per_s"][rows],
        "mfu": c["mfu"][rows], "hfu": c["hfu"][rows],
        "dominant": np.array(TIME_PARTS)[c["dominant"][rows]],
    }
    if "band" in c:  # the step time is step_s * (1 +- error_band) (cost/error_band.py)
        data["error_band"] = c["band"][rows]
    if "mfu_ceiling" in c:  # the validated runs' highest predicted MFU (NaN: none)
        data["mfu_ceiling"] = c["mfu_ceiling"][rows]
        data["above_validated"] = above_ceiling(c["mfu"][rows], c["mfu_ceiling"][rows])
    if capacity is not None and "mem_allocator" in c:
        data["mem_tight_gib"] = memory.tight_by_bytes(
            c["mem_total"][rows], c["mem_allocator"][rows], capacity[rows]) / GIB
    for k in TIME_PARTS:
        data[f"time_{k}_s"] = c[f"time_{k}"][rows]
    data["gbs"] = c["gbs"][rows]
    if "dp_shard" in c:  # HSDP shard group (0: all of dp) and the gradient reduce dtype
        data["dp_shard"] = c["dp_shard"][rows]
        data["grad_reduce"] = np.array([d.value if d else "" for d in REDUCE_DTYPES],
                                       dtype=object)[c["grad_reduce"][rows]].astype(str)
    if targets.train_tokens is not None:
        data["days"] = targets.train_tokens / np.asarray(c["tokens_per_s"][rows], float) / 86400.0
    if targets.train_tokens is not None or "cost" in targets.objectives:
        data["gpu_hours"] = gpu_hours(c["tokens_per_s"][rows], c["num_gpus"][rows],
                                      targets.cost_tokens)
        if "price_per_gpu_hour" in c:  # NaN where the profile has no price
            data["usd"] = data["gpu_hours"] * c["price_per_gpu_hour"][rows]
    if front is not None:
        data["pareto"] = front[rows]
    data["status"] = np.where(reason < 0, "feasible",
                              np.array(MISS_KEYS, dtype=object)[np.maximum(reason, 0)])
    if "trial" in c:
        data["trial"] = c["trial"][rows]
    data["cluster"] = np.array(scored.clusters or ("",), dtype=object)[  # the profile of each
        c["cluster"][rows] if "cluster" in c else np.zeros(len(rows), dtype=np.int64)]
    return pd.DataFrame(data)


def _empty_columns(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Nothing was scored (every candidate broke a rule): the estimate columns a frame shows,
    empty, so the no-plan outcome has the same table shape as any other."""
    names = ("mem_total", "mem_host", "time_step", "tokens_per_s", "mfu", "hfu", "dominant",
             *(f"time_{k}" for k in TIME_PARTS))
    return {**{k: np.zeros(0, dtype=np.int64 if k == "dominant" else float) for k in names},
            **cols}
