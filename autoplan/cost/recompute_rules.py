"""Which recompute a runtime runs, as rules over plan tables (autoplan.plan_table columns): the
policies it has (policy), selective recompute only through Megatron's model code
(selective_without_model_code), a count of recomputed layers (partial_recompute) and modules
recomputed by name (modules). Each is a rows/message pair that runtime_rules.RULES applies, in
its order, with the runtime's other rules; a plan's own recompute rules are plan_rules_layout's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.cost.runtimes import RuntimeTraits
from autoplan.model_spec import ModelSpec
from autoplan.plan_table import (
    RC_BLOCK,
    RC_FULL,
    RC_MODULES,
    RC_NONE,
    RC_SELECTIVE,
    RECOMPUTE,
    Table,
    dp_col,
    mask_modules,
    modules_mask,
)


def row_value(t: Table, col: str) -> int:
    """Column `col` of a one-row table (the plan a message is about); runtime_rules' messages
    read their plan with it too."""
    return int(t[col][0])


def policy(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    codes = [i for i, p in enumerate(RECOMPUTE) if p.value in rt.recompute_policies]
    return ~np.isin(t["recompute"], codes)


def policy_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    return (f"runtime {rt.name} has no {RECOMPUTE[row_value(t, 'recompute')].value} recompute "
            f"(it runs {', '.join(rt.recompute_policies)})")


def selective_without_model_code(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    return (rt.selective_needs_model_parallel & (t["recompute"] == RC_SELECTIVE)
            & (t["tp"] == 1) & (t["pp"] == 1))


def selective_without_model_code_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    return (f"runtime {rt.name} recomputes selectively only through Megatron's model code, with "
            f"tp or pp above 1 (got tp=1, pp=1); its ZeRO config checkpoints whole blocks: set "
            f"recompute.policy full or none")


def partial_recompute(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    k = t["recompute_layers"]  # -1: every layer of the stage
    partial = (t["recompute"] != RC_NONE) & (k >= 0)
    if rt.partial_recompute:
        return partial & (t["recompute"] == RC_SELECTIVE) & (not rt.partial_selective)
    if not rt.nth_block_recompute:
        return partial
    # torchtitan's selective_ac_option = n checkpoints whole blocks, fully: the block method
    nth = ((t["pp"] == 1) & (k > 0) & (m.num_layers % np.maximum(k, 1) == 0)
           & (t["recompute"] == RC_FULL) & (dp_col(t, "rc_method") == RC_BLOCK))
    return partial & ~nth


def partial_recompute_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    n = row_value(t, "recompute_layers")
    if rt.partial_recompute:
        return (f"runtime {rt.name} counts recomputed layers for full recompute only "
                f"(recompute.num_layers={n} with policy selective: set it null, or use policy "
                "full)")
    if not rt.nth_block_recompute:
        return (f"runtime {rt.name} recomputes every block or none "
                f"(recompute.num_layers={n}: set it null)")
    return (f"runtime {rt.name} recomputes every block, none, or every n-th block fully "
            f"without a pipeline (recompute.num_layers={n}: null, or with policy full, method "
            "block and pp=1 a count that divides the layers)")


def _modules_lacking(rt: RuntimeTraits) -> int:
    """Bits of column rc_modules (plan_table.RC_MODULES) naming modules the runtime cannot
    recompute by name (RuntimeTraits.recompute_modules)."""
    return modules_mask(tuple(m for m in RC_MODULES if m.value not in rt.recompute_modules))


def modules(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    if "rc_modules" not in t:  # a table that tries no module sets
        return np.zeros(np.shape(t["pp"]), dtype=bool)
    return (np.asarray(t["rc_modules"]) & _modules_lacking(rt)) > 0


def modules_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    names = mask_modules(row_value(t, "rc_modules") & _modules_lacking(rt)) or ()
    has = ", ".join(rt.recompute_modules) or "none"
    return (f"runtime {rt.name} cannot recompute {', '.join(m.value for m in names)} by module "
            f"(recompute.modules; it names: {has}): drop them, or use selective without modules")
