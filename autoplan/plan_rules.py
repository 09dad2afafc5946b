"""Validity rules for plans, vectorised: one rule set judges one plan or a million candidates.

Each rule gives a boolean column "violated" and, for one row, a message naming the field, the
value and a fix. Search counts rejected candidates by the first rule they break; `validate_plan`
lists every rule one plan breaks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.hardware import ClusterSpec
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, RecomputeModule
from autoplan.plan_table import (
    GPIPE,
    INTERLEAVED,
    RC_FULL,
    RC_NONE,
    RC_SELECTIVE,
    RC_UNIFORM,
    SCHEDULES,
    ZERO_BUBBLE,
    Table,
    chunk_min,
    col,
    dp_col,
    expert_col,
    fp8_col,
    modules_mask,
    plan_to_row,
)


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


def _divisors(n: int, proper: bool = False) -> str:
    """The divisors of n (below n when `proper`), as a short list."""
    ds = [str(d) for d in range(1, n if proper else n + 1) if n % d == 0]
    return ", ".join(ds if len(ds) <= 12 else [*ds[:6], "...", *ds[-3:]])


def _shard_choices(dp: int) -> str:
    """The valid parallel.dp_shard values before `null`: the divisors of dp below it."""
    below = _divisors(dp, proper=True)
    return f"from {below} or " if below else ""


def _int(t: Table, name: str, i: int) -> int:
    return int(col(t, name)[i])


@functools.cache
def optimizer_offload_stage() -> int | None:
    """The lowest ZeRO stage at which every runtime preset that offloads the optimizer alone
    runs that offload (RuntimeTraits.offload_zero_stages: Megatron-Core's ZeRO-1 only,
    DeepSpeed's 1 to 3), so advice that names it holds under whichever runtime prices the plan;
    None if the presets share no stage."""
    from autoplan.cost.runtimes import RUNTIMES, load_runtime

    offloading = [load_runtime(name) for name in RUNTIMES]
    stages = set.intersection(*(set(rt.offload_zero_stages) for rt in offloading
                                if "optimizer" in rt.offload))
    return min(stages, default=None)


def _recompute_layers_message(t: Any, i: int) -> str:
    """What is wrong with recompute.num_layers: no policy to apply it with, or more blocks
    than the smallest stage holds (or both)."""
    layers, most = _int(t, "recompute_layers", i), int(chunk_min(t)[i])
    wrong, fixes = [], []
    if col(t, "recompute")[i] == RC_NONE:
        wrong.append("needs a policy other than none")
        fixes.append("set recompute.policy (full or selective)")
    if layers > most:
        wrong.append(f"must be at most the blocks of the smallest pipeline stage ({most}: the "
                     "runtime recomputes that many of every stage)")
        fixes.append(f"lower it to {most} or less")
    return (f"recompute.num_layers={layers} {' and '.join(wrong)}; {', '.join(fixes)}, "
            "or set it null for every block")


def _offload_stage_fix(params_offloaded: bool) -> str:
    """The fix for an optimizer offload at ZeRO-0 (offload-optimizer-needs-zero)."""
    if params_offloaded:
        return "set zero_stage: 3, which offload.params needs too"
    stage = optimizer_offload_stage()
    if stage is None:
        return "set zero_stage to a stage the runtime offloads the optimizer at"
    return (f"set zero_stage: {stage}, a stage every runtime that offloads the optimizer alone "
            "offloads it at")


@dataclass(frozen=True)
class Rule:
    key: str
    """Short name used to count rejected candidates."""
    violated: Callable[[Table, ModelSpec], np.ndarray | np.bool_]
    """Which rows break the rule (a scalar where it depends on the model alone)."""
    message: Callable[[Table, int, ModelSpec], str]


def _batch_message(gbs: int, dp: int, mbs: int) -> str:
    if gbs % dp:
        return (f"batch.global_batch_size={gbs} is not divisible by dp={dp}; change either "
                "(each data-parallel rank takes an equal share)")
    return (f"local batch {gbs // dp} (batch.global_batch_size={gbs} / dp={dp}) is not a "
            f"multiple of micro_batch_size={mbs}; change either")


def virtual_stages_fit(num_layers: int, pp: Any, vpp: Any, ends_empty: Any = False
                       ) -> np.ndarray:
    """Each of the pp * vpp virtual stages can hold a block, but for an embedding-only first
    and a loss-only last stage where `ends_empty` (the embed-loss split, Megatron-Core's
    layout "E|t|...|t|L": Llama 3.1 405B's 126 layers on pp 16 x vpp 8). Rule pp-le-layers;
    the search lists no vpp that breaks it (autoplan.search.derived.auto_vpp)."""
    return np.asarray(pp) * np.asarray(vpp) <= num_layers + 2 * np.asarray(ends_empty)


def _embed_loss(t: Table) -> Any:
    """Rows of a search table whose split is embed-loss (a plan's own layers_per_stage is
    checked by validate_plan and Pipeline instead)."""
    if "split" not in t:
        return False
    from autoplan.search_space import Split

    return col(t, "split") == list(Split).index(Split.EMBED_LOSS)


def even_split_fits(num_layers: int, pp: Any, vpp: Any) -> np.ndarray:
    """The even split exists: pp * vpp divides the layers (rule pp-vpp-divides-layers;
    Megatron-Core's --num-layers-per-virtual-pipeline-stage needs it, megatron/training/
    arguments.py validate_args)."""
    return num_layers % (np.asarray(pp) * np.asarray(vpp)) == 0


def _micro(t: Table) -> np.ndarray:
    return col(t, "gbs") // np.maximum(col(t, "dp") * col(t, "mbs"), 1)


_LAYERNORM_BIT = modules_mask((RecomputeModule.LAYERNORM,))
_MOE_ACT_BIT = modules_mask((RecomputeModule.MOE_ACT,))
_MOE_BIT = modules_mask((RecomputeModule.MOE,))

RULES: tuple[Rule, ...] = (
    Rule(
        "tp-divides-heads",
        lambda t, m: m.num_heads % col(t, "tp") != 0,
        lambda t, i, m: f"parallel.tp={_int(t, 'tp', i)} does not divide num_heads="
        f"{m.num_heads}; choose tp from {_divisors(m.num_heads)}",
    ),
    Rule(
        "tp-divides-kv-heads",
        lambda t, m: m.kv_heads % col(t, "tp") != 0,
        lambda t, i, m: f"parallel.tp={_int(t, 'tp', i)} does not divide num_kv_heads="
        f"{m.kv_heads}; choose tp from {_divisors(m.kv_heads)}",
    ),
    Rule(
        "tp-divides-ffn",
        lambda t, m: m.ffn % col(t, "tp") != 0,
        lambda t, i, m: f"parallel.tp={_int(t, 'tp', i)} does not divide ffn_hidden_size="
        f"{m.ffn}; choose a tp that divides it",
    ),
    Rule(
        "pp-vpp-divides-layers",
        lambda t, m: ~even_split_fits(m.num_layers, col(t, "pp"), col(t, "vpp")),
        lambda t, i, m: f"parallel.pp * pipeline.vpp = {_int(t, 'pp', i) * _int(t, 'vpp', i)} "
        f"does not divide num_layers={m.num_layers}; choose pp * vpp from "
        f"{_divisors(m.num_layers)} or give pipeline.layers_per_stage",
    ),
    Rule(
        "batch-divides",
        lambda t, m: col(t, "gbs") % (col(t, "dp") * col(t, "mbs")) != 0,
        lambda t, i, m: _batch_message(_int(t, "gbs", i), _int(t, "dp", i), _int(t, "mbs", i)),
    ),
    Rule(
        "microbatches-ge-pp",
        lambda t, m: (col(t, "pp") > 1) & (col(t, "schedule") != GPIPE)
        & (_micro(t) < col(t, "pp")),
        lambda t, i, m: f"pipeline.schedule={SCHEDULES[_int(t, 'schedule', i)].value} needs "
        f"micro-batches per step ({int(_micro(t)[i])}) >= pp={_int(t, 'pp', i)}; raise "
        "global_batch_size or lower micro_batch_size or dp",
    ),
    Rule(
        "interleaved-microbatches",
        lambda t, m: (col(t, "schedule") == INTERLEAVED) & (col(t, "pp") > 1)
        & (_micro(t) % col(t, "pp") != 0),
        lambda t, i, m: f"pipeline.schedule=interleaved-1f1b needs micro-batches per step "
        f"({int(_micro(t)[i])}) to be a multiple of pp={_int(t, 'pp', i)}",
    ),
    Rule(
        "zero-bubble-microbatches",
        lambda t, m: (col(t, "schedule") == ZERO_BUBBLE) & (col(t, "pp") > 1)
        & (_micro(t) % col(t, "pp") != 0),
        lambda t, i, m: f"pipeline.schedule=zero-bubble needs micro-batches per step "
        f"({int(_micro(t)[i])}) to be a multiple of pp={_int(t, 'pp', i)}",
    ),
    Rule(
        "zero-bubble-selective",
        lambda t, m: (col(t, "schedule") == ZERO_BUBBLE) & (col(t, "pp") > 1)
        & (col(t, "recompute") == RC_SELECTIVE),
        lambda t, i, m: "pipeline.schedule=zero-bubble splits backward into input and weight "
        "passes, which selective recompute cannot follow; use recompute none or full",
    ),
    Rule(
        "vpp-needs-interleaving",
        lambda t, m: (col(t, "vpp") > 1)
        & ((col(t, "pp") == 1) | ~np.isin(col(t, "schedule"), (INTERLEAVED, ZERO_BUBBLE))),
        lambda t, i, m: f"pipeline.vpp={_int(t, 'vpp', i)} needs pp > 1 and schedule "
        "interleaved-1f1b or zero-bubble; set vpp: 1 or change the schedule",
    ),
    Rule(
        "interleaving-needs-vpp",
        lambda t, m: (col(t, "schedule") == INTERLEAVED) & (col(t, "vpp") < 2)
        & (col(t, "pp") > 1),
        lambda t, i, m: "pipeline.schedule=interleaved-1f1b needs vpp >= 2; set pipeline.vpp "
        "or use 1f1b",
    ),
    Rule(
        "sp-needs-tp",
        lambda t, m: col(t, "sp") & (col(t, "tp") == 1),
        lambda t, i, m: "sequence_parallel=true needs parallel.tp > 1; set it false or raise tp",
    ),
    Rule(
        "sp-divides-seq",
        lambda t, m: col(t, "sp") & ((m.seq_len // col(t, "cp")) % col(t, "tp") != 0),
        lambda t, i, m: f"sequence_parallel=true: tp={_int(t, 'tp', i)} does not divide the "
        f"per-cp-rank sequence seq_len/cp = {m.seq_len}/{_int(t, 'cp', i)} = "
        f"{m.seq_len // _int(t, 'cp', i)}; lower tp or cp",
    ),
    Rule(
        "cp-divides-seq",
        lambda t, m: (m.seq_len % (2 * col(t, "cp")) != 0) & (col(t, "cp") > 1),
        lambda t, i, m: f"parallel.cp={_int(t, 'cp', i)}: model.seq_len={m.seq_len} is not "
        f"divisible by 2*cp={2 * _int(t, 'cp', i)} (the load-balanced layout cuts it into 2*cp "
        f"chunks); pick a cp that divides {m.seq_len}/2",
    ),
    Rule(
        "offload-params-needs-zero3",
        lambda t, m: col(t, "offload_params") & (col(t, "zero_stage") != 3),
        lambda t, i, m: f"offload.params=true needs zero_stage=3, got {_int(t, 'zero_stage', i)}",
    ),
    Rule(
        "offload-optimizer-needs-zero",
        lambda t, m: col(t, "offload_optimizer") & (col(t, "zero_stage") == 0),
        lambda t, i, m: "offload.optimizer=true: offload needs zero_stage >= 1 (ZeRO-Offload "
        f"partitions the optimizer first); {_offload_stage_fix(bool(col(t, 'offload_params')[i]))}",
    ),
    Rule(
        "recompute-layers",
        lambda t, m: (col(t, "recompute_layers") >= 0)
        & (((col(t, "recompute") == RC_NONE) & (col(t, "recompute_layers") > 0))
           | (col(t, "recompute_layers") > chunk_min(t))),
        lambda t, i, m: _recompute_layers_message(t, i),
    ),
    Rule(
        "pp-le-layers",
        lambda t, m: ~virtual_stages_fit(m.num_layers, col(t, "pp"), col(t, "vpp"),
                                         _embed_loss(t)),
        lambda t, i, m: f"parallel.pp * vpp = {_int(t, 'pp', i) * _int(t, 'vpp', i)} exceeds "
        f"num_layers={m.num_layers} (every virtual stage needs a block, but an embedding-only "
        "first and a loss-only last one); lower pp or vpp",
    ),
    Rule(
        "recompute-moe-act-dense",
        lambda t, m: ((dp_col(t, "rc_modules") & _MOE_ACT_BIT) > 0) & np.bool_(m.moe is None),
        lambda t, i, m: f"recompute.modules moe_act with model {m.name}, which has no experts: "
        "moe_act re-runs a MoE block's expert activation; drop moe_act",
    ),
    Rule(
        "recompute-moe-dense",
        lambda t, m: ((dp_col(t, "rc_modules") & _MOE_BIT) > 0) & np.bool_(m.moe is None),
        lambda t, i, m: f"recompute.modules moe with model {m.name}, which has no experts: "
        "moe re-runs a MoE layer; drop moe (mlp recomputes a dense MLP)",
    ),
    Rule(
        "recompute-moe-and-moe-act",
        lambda t, m: (dp_col(t, "rc_modules") & (_MOE_BIT | _MOE_ACT_BIT)) == (
            _MOE_BIT | _MOE_ACT_BIT),
        lambda t, i, m: "recompute.modules lists moe and moe_act: moe already re-runs the "
        "whole MoE layer, its experts' activation included; drop moe_act",
    ),
    Rule(
        "recompute-uniform-policy",
        lambda t, m: (dp_col(t, "rc_method") == RC_UNIFORM)
        & ((col(t, "recompute") != RC_FULL) | (col(t, "recompute_layers") < 1)),
        lambda t, i, m: "recompute.method=uniform needs policy full and num_layers >= 1 (the "
        "layers per checkpointed group)",
    ),
    Rule(
        "dp-shard-divides-dp",
        lambda t, m: (dp_col(t, "dp_shard") > 0)
        & ((col(t, "dp") % np.maximum(dp_col(t, "dp_shard"), 1) != 0)
           | (dp_col(t, "dp_shard") >= col(t, "dp"))),
        lambda t, i, m: f"parallel.dp_shard={int(dp_col(t, 'dp_shard')[i])} must be a divisor "
        f"of dp={_int(t, 'dp', i)} below it (HSDP: dp / dp_shard replicas of each shard group); "
        f"choose {_shard_choices(_int(t, 'dp', i))}null (shard over all of dp)",
    ),
    Rule(
        "dp-shard-needs-zero",
        lambda t, m: (dp_col(t, "dp_shard") > 0) & (col(t, "zero_stage") == 0),
        lambda t, i, m: f"parallel.dp_shard={int(dp_col(t, 'dp_shard')[i])} needs zero_stage "
        ">= 1 (ZeRO-0 shards nothing); set zero_stage or dp_shard: null",
    ),
)


_NEVER = np.zeros(1, dtype=bool)
"""A rule that cannot apply to this model (broadcast to every row)."""


def _experts(m: ModelSpec) -> int:
    return 0 if m.moe is None else m.moe.num_experts


def _expert_group(t: Table) -> np.ndarray:
    """dp x cp x tp: the ranks of one pipeline stage, which Megatron-Core folds into
    etp x ep x expert-dp (parallel_state.initialize_model_parallel, "MoE parallel folding")."""
    return col(t, "dp") * col(t, "cp") * col(t, "tp")


def _hsdp_expert_group(t: Table) -> np.ndarray:
    """dp_shard x cp x tp: one HSDP shard group's ranks of a stage, where its experts fold."""
    return np.maximum(dp_col(t, "dp_shard"), 1) * col(t, "cp") * col(t, "tp")


MOE_RULES: tuple[Rule, ...] = (
    Rule(
        "ep-needs-moe",
        lambda t, m: _NEVER if m.moe is not None
        else (expert_col(t, "ep") > 1) | (expert_col(t, "etp") > 1),
        lambda t, i, m: f"parallel.ep={int(expert_col(t, 'ep')[i])}, etp="
        f"{int(expert_col(t, 'etp')[i])}: model {m.name} has no experts; set ep: 1 and etp: 1",
    ),
    Rule(
        "ep-divides-experts",
        lambda t, m: _NEVER if m.moe is None else _experts(m) % expert_col(t, "ep") != 0,
        lambda t, i, m: f"parallel.ep={int(expert_col(t, 'ep')[i])} does not divide "
        f"moe.num_experts={_experts(m)}; choose ep from {_divisors(max(_experts(m), 1))}",
    ),
    Rule(
        "etp-divides-expert-ffn",
        lambda t, m: _NEVER if m.moe is None
        else m.moe.expert_ffn_hidden_size % expert_col(t, "etp") != 0,
        lambda t, i, m: f"parallel.etp={int(expert_col(t, 'etp')[i])} does not divide "
        f"moe.expert_ffn_hidden_size={m.moe.expert_ffn_hidden_size if m.moe else 0}; "
        "choose an etp that divides it",
    ),
    Rule(
        "ep-etp-divides-dp-cp-tp",
        lambda t, m: _NEVER if m.moe is None  # ep-needs-moe refuses ep > 1 there
        else _expert_group(t) % (expert_col(t, "ep") * expert_col(t, "etp")) != 0,
        lambda t, i, m: f"parallel.ep * etp = "
        f"{int(expert_col(t, 'ep')[i] * expert_col(t, 'etp')[i])} does not divide dp * cp * tp "
        f"= {int(_expert_group(t)[i])} (Megatron-Core folds the expert grid into it); choose "
        f"ep * etp from {_divisors(int(_expert_group(t)[i]))}",
    ),
    Rule(
        "ep-etp-divides-hsdp-shard",
        lambda t, m: _NEVER if m.moe is None
        else (dp_col(t, "dp_shard") > 0)
        & (_hsdp_expert_group(t) % (expert_col(t, "ep") * expert_col(t, "etp")) != 0),
        lambda t, i, m: f"parallel.ep * etp = "
        f"{int(expert_col(t, 'ep')[i] * expert_col(t, 'etp')[i])} does not divide dp_shard * "
        f"cp * tp = {int(_hsdp_expert_group(t)[i])}: under HSDP the experts fold into one shard "
        "group, each replica holding them whole; choose ep * etp from "
        f"{_divisors(int(_hsdp_expert_group(t)[i]))} or dp_shard: null",
    ),
)
RULES = RULES + MOE_RULES
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


def _moe_tokens_split_over_tp(t: Table, m: ModelSpec) -> np.ndarray:
    """Tokens of one micro-batch on one rank (mbs * seq_len / cp) split evenly over tp."""
    return (col(t, "mbs") * (m.seq_len // col(t, "cp"))) % col(t, "tp") == 0


def _expert_ranks(t: Table) -> np.ndarray:
    """ep * etp: the ranks one layer's routed experts are spread over."""
    return expert_col(t, "ep") * expert_col(t, "etp")



RUNTIME_RULES: tuple[Rule, ...] = (
    Rule(
        "runtime-layernorm-recompute-tp",
        lambda t, m: ((dp_col(t, "rc_modules") & _LAYERNORM_BIT) > 0) & (col(t, "tp") > 1),
        lambda t, i, m: f"recompute.modules layernorm with tp={_int(t, 'tp', i)}: autoplan's "
        "runtime discards norm outputs only where the GEMMs save them as plain tensors (tp 1; "
        "under tensor parallelism they are DTensors); drop layernorm, or export to Megatron-LM",
    ),
    Rule(
        "runtime-moe-capacity",
        lambda t, m: np.bool_(m.moe is not None and m.moe.capacity_factor is not None)
        & (col(t, "cp") > 1),
        lambda t, i, m: f"model.moe.capacity_factor={m.moe.capacity_factor if m.moe else None} "
        f"with parallel.cp={_int(t, 'cp', i)}: autoplan's runtime drops tokens per whole "
        "sequence, which context parallelism splits; set capacity_factor: null or cp: 1",
    ),
    Rule(
        "runtime-moe-groups-softmax",
        lambda t, m: np.bool_(m.moe is not None and m.moe.route_groups > 1
                              and not m.moe.router_aux_free),
        lambda t, i, m: f"model.moe.route_groups={m.moe.route_groups if m.moe else None} with "
        "router_aux_free=false: autoplan's runtime limits routing to groups with DeepSeek-V3's "
        "sigmoid router only; set router_aux_free: true or route_groups: 1",
    ),
    Rule(
        "runtime-fp8-tp",
        lambda t, m: fp8_col(t) & (col(t, "tp") > 1),
        lambda t, i, m: f"precision fp8 with tp={_int(t, 'tp', i)}: autoplan's runtime trains "
        "fp8 through torchao's float8 layers without their tensor-parallel styles "
        "(runtime/float8.py); use tp 1 or bf16, or export to Megatron-LM or torchtitan",
    ),
    Rule(
        "runtime-mtp",
        lambda t, m: np.bool_(m.mtp_layers > 0),
        lambda t, i, m: f"model.mtp_layers={m.mtp_layers}: autoplan's runtime has no "
        "multi-token-prediction module (DeepSeek-V3 report §2.2); set mtp_layers: 0 to train "
        "the main model alone, or export to Megatron-LM (--mtp-num-layers)",
    ),
    Rule(
        "runtime-hsdp-ep",
        lambda t, m: (dp_col(t, "dp_shard") > 0) & (_expert_ranks(t) > 1),
        lambda t, i, m: f"parallel.dp_shard={int(dp_col(t, 'dp_shard')[i])} with ep="
        f"{int(expert_col(t, 'ep')[i])}, etp={int(expert_col(t, 'etp')[i])}: autoplan's runtime "
        "shards MoE experts over their own expert-DP mesh without HSDP; set dp_shard: null",
    ),
    Rule(
        "runtime-ep-tp-tokens",
        lambda t, m: (_expert_ranks(t) > 1) & (col(t, "tp") > 1)
        & ~_moe_tokens_split_over_tp(t, m),
        lambda t, i, m: f"parallel.ep={int(expert_col(t, 'ep')[i])}, etp="
        f"{int(expert_col(t, 'etp')[i])} with tp={_int(t, 'tp', i)}: "
        f"each tp rank sends 1/tp of a micro-batch's {_int(t, 'mbs', i)} * "
        f"{m.seq_len // _int(t, 'cp', i)} tokens to the experts; choose a micro_batch_size "
        "that makes them divisible by tp",
    ),
)
"""What autoplan's own runtime cannot run (autoplan train), apart from the planner's rules:
search and export still consider these plans (Megatron-LM runs them)."""
RUNTIME_RULE_KEYS: tuple[str, ...] = tuple(r.key for r in RUNTIME_RULES)


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
