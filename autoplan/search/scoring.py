"""Judge and score a candidate table in a few numpy passes: the plan rules first (each rejected
candidate counted by the first rule it breaks), then one `estimate_table` per precision/attention
pair over the valid rows, then memory and targets.

Used alike by the exhaustive search (a million rows) and by each Optuna trial (one row).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoplan.cost import runtime_rules
from autoplan.cost.estimate import TIME_PARTS, default_runtime, estimate_table
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.plan import Attention, Precision, ReduceDtype, Schedule
from autoplan.plan_rules import BF16_REDUCE_PRECISIONS, RULE_KEYS, RULES, violations
from autoplan.plan_table import (
    DTYPE_COLUMN,
    EAGER_COLUMN,
    FP8_COLUMN,
    PRECISIONS,
    RC_NONE,
    RC_UNIFORM,
    REDUCE_DTYPES,
    SCHEDULES,
)
from autoplan.search.targets import MISS_KEYS, Targets, miss_ratios, objective_matrix
from autoplan.search_space import SearchSpace

log = logging.getLogger(__name__)

REASON_KEYS = ("world-size", "batch-range", *RULE_KEYS, "duplicate", "precision-unsupported",
               "runtime-unsupported", *MISS_KEYS)
"""Every way a candidate can fail, in the order it is checked. batch-range: a sampled layout
whose dp takes no size of the --global-batch-size range (the exhaustive search lists none)."""
_UNEVEN_EXEMPT = RULE_KEYS.index("pp-vpp-divides-layers")


@dataclass(frozen=True)
class Context:
    """What scoring needs besides the table."""

    model: ModelSpec
    profile: ClusterProfile
    space: SearchSpace
    targets: Targets
    runtime: RuntimeTraits | None = None
    """The runtime the plans are priced for and must run on (default: autoplan's own)."""


@dataclass
class Scored:
    """Scored candidates (valid ones only) and the count of every candidate by reason."""

    cols: dict[str, np.ndarray]
    """Candidate columns plus estimate columns, `objectives` (rows x objectives, smaller is
    better), `miss` (rows x MISS_KEYS ratios), `reason` (-1 feasible, else index into
    MISS_KEYS) and `dominant` (index into TIME_PARTS)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Candidates by reason: REASON_KEYS plus "feasible"."""
    runtime: str = ""
    """The runtime-traits preset the estimates priced."""
    clusters: tuple[str, ...] = ()
    """Profile names the `cluster` column indexes (every search names its profile per row)."""

    @property
    def n(self) -> int:
        return len(self.cols["reason"])

    @property
    def feasible(self) -> np.ndarray:
        return self.cols["reason"] < 0


def canonical_schedule(space: SearchSpace) -> int:
    """The schedule kept for pp == 1 (where all schedules are the same plan)."""
    keep = Schedule.ONE_F_ONE_B if Schedule.ONE_F_ONE_B in space.pipeline.schedule \
        else space.pipeline.schedule[0]
    return SCHEDULES.index(Schedule(keep))


def first_rule(table: Mapping[str, np.ndarray], model: ModelSpec) -> np.ndarray:
    """Index into RULES of the first rule each row breaks, -1 if none; uneven splits (split=1)
    are exempt from pp*vpp dividing the layers."""
    bad = violations(table, model)
    if "split" in table:
        bad[:, _UNEVEN_EXEMPT] &= np.asarray(table["split"]) == 0
    return np.where(bad.any(axis=1), bad.argmax(axis=1), -1)


def duplicates(t: Mapping[str, np.ndarray], space: SearchSpace) -> np.ndarray:
    """Rows that are the same plan as another candidate of the space: any schedule but the
    canonical one when pp == 1, and "recompute k layers" where k covers the whole stage."""
    dup = (t["pp"] == 1) & (t["schedule"] != canonical_schedule(space))
    if None in space.recompute.num_layers:
        whole = (t["recompute"] != RC_NONE) & (t["recompute_layers"] >= 0) \
            & (t["recompute_layers"] * t["vpp"] >= t["layers_max"]) & (t["split"] == 0)
        if "rc_method" in t:  # uniform counts layers per group: a whole-stage group differs
            whole &= t["rc_method"] != RC_UNIFORM
        dup |= whole
    return dup


def _estimate_groups(t: dict[str, np.ndarray], ctx: Context) -> tuple[dict[str, np.ndarray],
                                                                       np.ndarray]:
    """estimate_table per (precision, attention) pair; rows whose precision the device lacks
    come back as unsupported."""
    n = len(t["dp"])
    out: dict[str, np.ndarray] = {}
    unsupported = np.zeros(n, dtype=bool)
    width = len(ctx.space.attention)  # one code per pair, counted in O(n) (no sort)
    present: Any = np.flatnonzero(np.bincount(t["precision"] * width + t["attention"])) \
        if n else []
    pairs: Any = [divmod(int(code), width) for code in present]
    for p_code, a_code in pairs:
        precision = ctx.space.precision[p_code].value
        rows = (t["precision"] == p_code) & (t["attention"] == a_code)
        if precision not in ctx.profile.device.peak_flops_per_s:
            unsupported |= rows
            continue
        if "grad_reduce" in t and precision not in BF16_REDUCE_PRECISIONS:
            bf16_reduce = rows & (t["grad_reduce"] == REDUCE_DTYPES.index(ReduceDtype.BF16))
            unsupported |= bf16_reduce  # no bf16 gradients to reduce in bf16
            rows &= ~bf16_reduce
            if not rows.any():
                continue
        whole = bool(rows.all())
        sub = t if whole else {k: v[rows] for k, v in t.items()}
        est = estimate_table(sub, ctx.model, ctx.profile, precision,
                             ctx.space.attention[a_code].value, ctx.runtime)
        for k, v in est.items():
            v = np.broadcast_to(np.asarray(v), (len(sub["dp"]),))
            if k not in out:
                out[k] = np.zeros(n, dtype=v.dtype)
            if whole:
                out[k] = np.asarray(v)
            else:
                out[k][rows] = v
    return out, unsupported


def add_kernel_columns(t: dict[str, np.ndarray], space: SearchSpace) -> None:
    """The columns the runtime rules that turn on precision and kernels read, from the space's
    codes: plan_table's FP8_COLUMN, DTYPE_COLUMN and EAGER_COLUMN."""
    if Precision.FP8 in space.precision:
        t[FP8_COLUMN] = t["precision"] == space.precision.index(Precision.FP8)
    if space.precision:
        t[DTYPE_COLUMN] = np.array([PRECISIONS.index(p) for p in space.precision],
                                   dtype=np.int64)[t["precision"]]
    if space.attention:
        t[EAGER_COLUMN] = np.array([a is Attention.EAGER
                                    for a in space.attention])[t["attention"]]


def runtime_lacks(t: dict[str, np.ndarray], ctx: Context) -> np.ndarray:
    """Rows whose pipeline schedule, ZeRO stage, offload, HSDP or reduce dtype the runtime
    cannot run (so `search --runtime megatron` keeps to plans Megatron runs, and its winner
    exports): autoplan.cost.runtime_rules, the rules `estimate` names for one plan."""
    return runtime_rules.lacking(t, ctx.runtime or default_runtime(ctx.profile), ctx.model,
                                 ctx.profile.device)


def score_table(table: Mapping[str, np.ndarray], ctx: Context, *, dedupe: bool = True,
                counts: dict[str, int] | None = None) -> Scored:
    """Judge every row, score the valid ones, and count every row by reason."""
    counts = dict.fromkeys((*REASON_KEYS, "feasible"), 0) | (counts or {})
    t = {k: np.asarray(v) for k, v in table.items()}
    rule = first_rule(t, ctx.model)
    for j, key in enumerate(RULE_KEYS):
        counts[key] += int((rule == j).sum())
    keep = rule < 0
    if dedupe:
        dup = keep & duplicates(t, ctx.space)
        counts["duplicate"] += int(dup.sum())
        keep &= ~dup
    t = {k: v[keep] for k, v in t.items()} if not keep.all() else t
    add_kernel_columns(t, ctx.space)
    lacking = runtime_lacks(t, ctx)
    counts["runtime-unsupported"] += int(lacking.sum())
    if lacking.any():
        t = {k: v[~lacking] for k, v in t.items()}
    est, unsupported = _estimate_groups(t, ctx)
    counts["precision-unsupported"] += int(unsupported.sum())
    if unsupported.any():
        t = {k: v[~unsupported] for k, v in t.items()}
        est = {k: v[~unsupported] for k, v in est.items()}
    cols = {**t, **est}
    if not est:  # nothing valid: keep the column set so ranking code still works
        cols.update({k: np.zeros(0) for k in ("tokens_per_s", "time_step", "mem_total",
                                                 "mem_allocator", "mem_host")})
    prof = ctx.profile
    miss = miss_ratios(cols, ctx.targets, prof)
    missing = miss > 0
    reason = np.where(missing.any(axis=1), missing.argmax(axis=1), -1)
    for j, key in enumerate(MISS_KEYS):
        counts[key] += int((reason == j).sum())
    counts["feasible"] += int((reason < 0).sum())
    cols["miss"], cols["reason"] = miss, reason
    cols["objectives"] = objective_matrix(cols, ctx.targets)
    if est:
        cols["dominant"] = np.argmax(np.stack([cols[f"time_{k}"] for k in TIME_PARTS]), axis=0)
        bad = ~np.isfinite(cols["objectives"]).all(axis=1)
        if bad.any():  # a cost-model defect; never rank such a row
            log.warning("cost model returned non-finite values for %d candidates", bad.sum())
            cols["reason"] = np.where(bad & (reason < 0), 0, cols["reason"])
    else:
        cols["dominant"] = np.zeros(0, dtype=np.int64)
    return Scored(cols, counts, (ctx.runtime or default_runtime(ctx.profile)).name)


def rule_message(table: Mapping[str, np.ndarray], i: int, key: str, model: ModelSpec) -> str:
    """The plan rule's own message for row i (for "why was nothing found")."""
    return RULES[RULE_KEYS.index(key)].message(table, i, model)
