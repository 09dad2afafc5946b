"""Plans as columns: the numeric form the cost model and the rules score in one numpy pass.

A table holds one row per candidate plan; enums are small integer codes. `plan_to_row` turns one
Plan into a one-row table, so a single plan and a million candidates go through the same code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from autoplan.model_spec import ModelSpec
from autoplan.plan import (
    Attention,
    Batch,
    ClusterRef,
    Offload,
    Parallel,
    Pipeline,
    Plan,
    Precision,
    Recompute,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    ReduceDtype,
    Schedule,
)

SCHEDULES: tuple[Schedule, ...] = tuple(Schedule)
"""Code i in column `schedule` means SCHEDULES[i]."""
RECOMPUTE: tuple[RecomputePolicy, ...] = tuple(RecomputePolicy)
"""Code i in column `recompute` means RECOMPUTE[i]: 0 none, 1 selective, 2 full."""
GPIPE, ONE_F_ONE_B, INTERLEAVED, ZERO_BUBBLE = range(4)
RC_NONE, RC_SELECTIVE, RC_FULL = range(3)

COLUMNS: dict[str, Any] = {
    "dp": np.int64, "tp": np.int64, "pp": np.int64, "cp": np.int64, "vpp": np.int64,
    "sp": np.bool_, "schedule": np.int64, "zero_stage": np.int64,
    "offload_optimizer": np.bool_, "offload_params": np.bool_,
    "recompute": np.int64, "recompute_layers": np.int64,
    "mbs": np.int64, "gbs": np.int64,
    "layers_max": np.int64, "layers_first": np.int64, "layers_last": np.int64,
}
"""Column -> dtype. recompute_layers = -1 means every layer of the stage; layers_max is the
layer count of the most loaded pipeline rank (all its chunks) and layers_first that of rank 0."""
EXPERT_COLUMNS: dict[str, Any] = {"ep": np.int64, "etp": np.int64}
"""Expert-parallel degrees (Parallel.ep, .etp): optional columns, 1 where a table lacks them, so
tables built before MoE existed (and the Optuna trials' tables) score as before."""


REDUCE_DTYPES: tuple[ReduceDtype | None, ...] = (None, ReduceDtype.FP32, ReduceDtype.BF16)
"""Code i in column `grad_reduce` means REDUCE_DTYPES[i] (0: the runtime's default)."""
DATA_PARALLEL_COLUMNS: dict[str, Any] = {"grad_reduce": np.int64, "dp_shard": np.int64}
"""Plan.grad_reduce_dtype (a REDUCE_DTYPES code) and Parallel.dp_shard (0: null, all of dp):
optional columns, 0 where a table lacks them, so older tables score as before."""


RC_MODULES: tuple[RecomputeModule, ...] = tuple(RecomputeModule)
"""Bit i of column `rc_modules` means RC_MODULES[i] (core_attn 1, mlp 2, layernorm 4, moe_act 8,
moe 16);
0: the runtime's own selective recompute."""
RC_METHODS: tuple[RecomputeMethod, ...] = tuple(RecomputeMethod)
"""Code i in column `rc_method` means RC_METHODS[i]: 0 block, 1 uniform."""
RC_BLOCK, RC_UNIFORM = range(2)
RECOMPUTE_COLUMNS: dict[str, Any] = {"rc_modules": np.int64, "rc_method": np.int64}
"""Recompute.modules (a bit mask) and Recompute.method: optional columns, 0 where a table
lacks them, so older tables score as before (autoplan.runtime.recompute runs them)."""


FP8_COLUMN = "fp8"
"""Optional boolean column: the row trains in fp8 (Plan.precision). Precision is otherwise a
search-space code outside the plan table; the runtime rules that depend on it (autoplan's own
runtime runs fp8 only at tp 1) read this column, False where a table lacks it."""


def fp8_col(table: Table) -> np.ndarray:
    """Column fp8 of `table`, False where the table has none."""
    if FP8_COLUMN in table:
        return np.asarray(table[FP8_COLUMN], dtype=bool)
    return np.zeros(len(np.asarray(table["dp"])), dtype=bool)


DTYPE_COLUMN, EAGER_COLUMN = "dtype", "eager"
"""Optional columns as fp8's, for the runtime rules that turn on the kernels: the row's precision
as a code into PRECISIONS (Precision's own order), and whether it runs eager attention.
Tables without them (bf16, fused attention) break none of those rules."""
PRECISIONS: tuple[Precision, ...] = tuple(Precision)


def dtype_col(table: Table, like: np.ndarray) -> np.ndarray:
    """Column dtype of `table`, bf16's code where the table has none."""
    if DTYPE_COLUMN in table:
        return np.asarray(table[DTYPE_COLUMN])
    return np.full(np.shape(like), PRECISIONS.index(Precision.BF16), dtype=np.int64)


def eager_col(table: Table, like: np.ndarray) -> np.ndarray:
    """Column eager of `table`, False where the table has none."""
    if EAGER_COLUMN in table:
        return np.asarray(table[EAGER_COLUMN], dtype=bool)
    return np.zeros(np.shape(like), dtype=bool)


def modules_mask(modules: tuple[RecomputeModule, ...] | None) -> int:
    return sum(1 << RC_MODULES.index(m) for m in modules or ())


def mask_modules(mask: int) -> tuple[RecomputeModule, ...] | None:
    return tuple(m for i, m in enumerate(RC_MODULES) if mask >> i & 1) or None


def dp_col(table: Table, name: str) -> np.ndarray:
    """Column grad_reduce or dp_shard of `table`, zeros (the defaults) where it has none."""
    if name in table:
        return np.asarray(table[name])
    return np.zeros(len(np.asarray(table["dp"])), dtype=np.int64)


def expert_col(table: Table, name: str) -> np.ndarray:
    """Column ep or etp of `table`, ones where the table has none."""
    if name in table:
        return np.asarray(table[name])
    return np.ones(len(np.asarray(table["dp"])), dtype=np.int64)

Table = Mapping[str, Any]


def col(table: Table, name: str) -> np.ndarray:
    return np.asarray(table[name])


CHUNK_COLUMN = "chunk_min"
"""Optional column: blocks of the smallest model chunk (pipeline stage) of the plan's split that
holds any (embed-loss splits leave the first and last stage without blocks); layers_max // vpp
where a table lacks it (an even split). recompute.num_layers counts blocks per
chunk and the runtime recomputes min(num_layers, chunk) of each (runtime/recompute.py), which
the cost model prices as num_layers * vpp per rank: plan_rules holds num_layers to this."""


def chunk_min(table: Table) -> np.ndarray:
    """Column chunk_min, or the even split's chunk where the table has none."""
    if CHUNK_COLUMN in table:
        return np.asarray(table[CHUNK_COLUMN])
    return np.asarray(table["layers_max"]) // np.maximum(np.asarray(table["vpp"]), 1)


def even_layers(model: ModelSpec, pp: np.ndarray) -> np.ndarray:
    """Layers per pipeline rank under an even split (ceil, so an uneven count is not hidden)."""
    return -(-model.num_layers // np.maximum(np.asarray(pp), 1))


def stages_of_rank(plan: Plan, rank: int) -> list[int]:
    """Pipeline stages (model chunks) rank `rank` holds: round-robin r, r + pp, ... (Megatron's
    interleaving), or the V order r and 2pp - 1 - r of zero-bubble with two chunks (ZB-V)."""
    pp, vpp = plan.parallel.pp, plan.pipeline.vpp
    if plan.pipeline.schedule is Schedule.ZERO_BUBBLE and vpp == 2:
        return [rank, 2 * pp - 1 - rank]
    return [rank + c * pp for c in range(vpp)]


def plan_to_row(plan: Plan, model: ModelSpec) -> dict[str, np.ndarray]:
    par, pipe = plan.parallel, plan.pipeline
    layers_last: int
    if pipe.layers_per_stage is not None and len(pipe.layers_per_stage) == par.pp * pipe.vpp:
        per_rank = [sum(pipe.layers_per_stage[s] for s in stages_of_rank(plan, r))
                    for r in range(par.pp)]
        layers_max, layers_first, layers_last = max(per_rank), per_rank[0], per_rank[-1]
        smallest = min(n for n in pipe.layers_per_stage if n > 0)
    else:
        layers_max = layers_first = layers_last = int(even_layers(model, np.array(par.pp)))
        smallest = layers_max // pipe.vpp
    n = plan.recompute.num_layers
    row = {
        "dp": par.dp, "tp": par.tp, "pp": par.pp, "cp": par.cp, "vpp": pipe.vpp,
        "sp": plan.sequence_parallel, "schedule": SCHEDULES.index(pipe.schedule),
        "zero_stage": plan.zero_stage,
        "offload_optimizer": plan.offload.optimizer, "offload_params": plan.offload.params,
        "recompute": RECOMPUTE.index(plan.recompute.policy),
        "recompute_layers": -1 if n is None else n,
        "mbs": plan.batch.micro_batch_size, "gbs": plan.batch.global_batch_size,
        "layers_max": layers_max, "layers_first": layers_first, "layers_last": layers_last,
        "ep": par.ep, "etp": par.etp,
        "grad_reduce": REDUCE_DTYPES.index(plan.grad_reduce_dtype),
        "dp_shard": par.dp_shard or 0,
        "rc_modules": modules_mask(plan.recompute.modules),
        "rc_method": RC_METHODS.index(plan.recompute.method),
        CHUNK_COLUMN: smallest,
    }
    row[FP8_COLUMN] = plan.precision is Precision.FP8
    row[DTYPE_COLUMN] = PRECISIONS.index(plan.precision)
    row[EAGER_COLUMN] = plan.attention is Attention.EAGER
    dtypes = {**COLUMNS, **EXPERT_COLUMNS, **DATA_PARALLEL_COLUMNS, **RECOMPUTE_COLUMNS,
              FP8_COLUMN: np.bool_, DTYPE_COLUMN: np.int64, EAGER_COLUMN: np.bool_,
              CHUNK_COLUMN: np.int64}
    return {k: np.array([v], dtype=dtypes[k]) for k, v in row.items()}


def row_to_plan(
    table: Table, i: int, model_ref: str | ModelSpec, cluster: ClusterRef, precision: Precision
) -> Plan:
    """Row i of a candidate table as a Plan (even layer split)."""
    def v(name: str) -> Any:
        return np.asarray(table[name])[i].item()

    rl = v("recompute_layers")
    return Plan(
        model=model_ref,
        cluster=ClusterRef(cluster.profile, int(v("dp") * v("tp") * v("pp") * v("cp"))),
        batch=Batch(micro_batch_size=v("mbs"), global_batch_size=v("gbs")),
        parallel=Parallel(dp=v("dp"), tp=v("tp"), pp=v("pp"), cp=v("cp"),
                          ep=v("ep") if "ep" in table else 1,
                          etp=v("etp") if "etp" in table else 1,
                          dp_shard=(v("dp_shard") or None) if "dp_shard" in table else None),
        sequence_parallel=bool(v("sp")),
        pipeline=Pipeline(schedule=SCHEDULES[v("schedule")], vpp=v("vpp")),
        zero_stage=v("zero_stage"),
        offload=Offload(optimizer=bool(v("offload_optimizer")), params=bool(v("offload_params"))),
        recompute=Recompute(policy=RECOMPUTE[v("recompute")], num_layers=None if rl < 0 else rl,
                            method=RC_METHODS[v("rc_method")] if "rc_method" in table
                            else RecomputeMethod.BLOCK,
                            modules=mask_modules(v("rc_modules")) if "rc_modules" in table
                            else None),
        precision=precision,
        grad_reduce_dtype=REDUCE_DTYPES[v("grad_reduce")] if "grad_reduce" in table else None,
    )
