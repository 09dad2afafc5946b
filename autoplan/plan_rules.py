"""Validity rules for plans, vectorised: one rule set judges one plan or a million candidates.

Each rule gives a boolean column "violated" and, for one row, a message naming the field, the
value and a fix; the families live in plan_rules_layout, plan_rules_moe and plan_rules_runtime.
Search counts rejected candidates by the first rule they break; `validate_plan` lists every rule
one plan breaks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.hardware import ClusterSpec
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.plan_rules_base import Rule
from autoplan.plan_rules_layout import LAYOUT_RULES
from autoplan.plan_rules_moe import MOE_RULES
from autoplan.plan_rules_runtime import RUNTIME_RULES
from autoplan.plan_table import Table, col, plan_to_row


def data_parallel_wrappers(dp: Any, tp: Any, pp: Any, cp: Any, expert_ranks: Any, zero: Any,
                           fp32: Any, offloaded: Any) -> tuple[Any, Any]:
    """(DDP, FSDP2): how autoplan's runtime wraps a plan for data parallelism, for one plan
    (ints and bools) or a table's columns alike; the runtime (runtime/data_parallel.uses_ddp,
    uses_fsdp) and the cost model (cost/rows.rows_of) both ask here. Pure ZeRO-0 data
    parallelism in fp32, without pipeline, tensor or context parallelism, offload or sharded
    experts, runs on torch DDP; FSDP2 wraps every other plan whose gradients need a reduction
    over dp * cp, every mixed-precision or offloaded plan, and every plan whose routed experts
    live on an expert mesh of their own (expert_ranks = ep * etp > 1: FSDP2's per-group
    reductions carry the experts over expert-data-parallel ranks only)."""
    experts = np.asarray(expert_ranks) > 1
    ddp = ((np.asarray(zero) == 0) & (np.asarray(dp) > 1) & (np.asarray(pp) == 1)
           & (np.asarray(tp) == 1) & (np.asarray(cp) == 1) & np.asarray(fp32, bool)
           & ~np.asarray(offloaded, bool) & ~experts)
    fsdp = ~ddp & ((np.asarray(dp) * np.asarray(cp) > 1) | ~np.asarray(fp32, bool)
                   | np.asarray(offloaded, bool) | experts)
    return ddp, fsdp


RULES: tuple[Rule, ...] = LAYOUT_RULES + MOE_RULES
"""The planner's rules, in the order search counts a candidate's first broken one by."""
RULE_KEYS: tuple[str, ...] = tuple(r.key for r in RULES)


def violations(table: Table, model: ModelSpec) -> np.ndarray:
    """Boolean matrix (rows x rules): which rules each candidate breaks."""
    n = len(col(table, "dp"))
    out = np.zeros((n, len(RULES)), dtype=bool)
    for j, rule in enumerate(RULES):
        out[:, j] = np.broadcast_to(rule.violated(table, model), (n,))
    return out


def first_violation(table: Table, model: ModelSpec) -> np.ndarray:
    """Index into RULES of the first rule each row breaks, or -1 for a valid row."""
    bad = violations(table, model)
    return np.where(bad.any(axis=1), bad.argmax(axis=1), -1)


def validate_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec | None = None) -> list[str]:
    """Every rule the plan breaks, as messages naming the field, the value and the fix.

    The one rule set of planner and runtime: search, estimate, export and `autoplan train`
    (runtime/validation.py) all judge a plan here. Each message is a structural mistake (exit
    2); whether a valid plan fits or meets a target is the cost model's answer (exit 3).
    Without `cluster` (its profile cannot be loaded) the GPU count is the plan's own and the
    precision is not checked against a device."""
    reasons: list[str] = []
    num_gpus = cluster.num_gpus if cluster is not None else plan.cluster.num_gpus
    if plan.world_size != num_gpus:
        reasons.append(
            f"dp * tp * pp * cp = {plan.world_size} but the cluster has {num_gpus} GPUs; "
            "make the degrees multiply to cluster.num_gpus"
        )
    lps = plan.pipeline.layers_per_stage
    stages = plan.parallel.pp * plan.pipeline.vpp
    if lps is not None and (len(lps) != stages or sum(lps) != model.num_layers):
        reasons.append(
            f"pipeline.layers_per_stage has {len(lps)} stages summing to {sum(lps)}; it needs "
            f"pp * vpp = {stages} entries summing to num_layers={model.num_layers}"
        )
    precision = plan.precision.value
    if cluster is not None and precision not in cluster.profile.device.peak_flops_per_s:
        have = ", ".join(cluster.profile.device.peak_flops_per_s)
        reasons.append(
            f"precision={precision} is not supported by {cluster.profile.device.name} "
            f"(it has {have}); choose one of those"
        )
    reasons += reduce_dtype_problems(plan)
    row = plan_to_row(plan, model)
    bad = violations(row, model)[0]
    for j, rule in enumerate(RULES):
        if bad[j] and not (rule.key in LAYER_COUNT_RULES and lps is not None):
            reasons.append(rule.message(row, 0, model))
    return reasons


LAYER_COUNT_RULES = ("pp-vpp-divides-layers", "pp-le-layers")
"""Rules a plan's own pipeline.layers_per_stage settles (its entries, checked above and by
Pipeline, say how many blocks each stage holds)."""
BF16_REDUCE_PRECISIONS = ("bf16", "fp8")
"""Precisions whose gradients can be reduced in bf16 (fp8 runs keep bf16 gradients)."""


def reduce_dtype_problems(plan: Plan) -> list[str]:
    """grad_reduce_dtype=bf16 needs bf16 gradients: a bf16 or fp8 plan. An fp16 plan's
    gradients would lose range in bf16 and an fp32 plan's precision; fp32 reduce fits all."""
    rd = plan.grad_reduce_dtype
    if rd is None or rd.value != "bf16" or plan.precision.value in BF16_REDUCE_PRECISIONS:
        return []
    return [f"grad_reduce_dtype=bf16 needs precision bf16 or fp8, got "
            f"precision={plan.precision.value}; set grad_reduce_dtype: fp32 or null"]


def runtime_limits(plan: Plan, model: ModelSpec) -> list[str]:
    """Every RUNTIME_RULES rule the plan breaks, as one-line messages."""
    row = plan_to_row(plan, model)
    bad = violations_of(RUNTIME_RULES, row, model)[0]
    return [rule.message(row, 0, model) for j, rule in enumerate(RUNTIME_RULES) if bad[j]]


def violations_of(rules: tuple[Rule, ...], table: Table, model: ModelSpec) -> np.ndarray:
    """Boolean matrix (rows x rules) of `rules`."""
    n = len(col(table, "dp"))
    out = np.zeros((n, len(rules)), dtype=bool)
    for j, rule in enumerate(rules):
        out[:, j] = np.broadcast_to(rule.violated(table, model), (n,))
    return out
