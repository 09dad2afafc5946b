"""The rules of a plan's layout: parallel degrees that divide the model's dimensions, the
pipeline's stages and schedule, the batch split, sequence and context parallelism, offload,
recompute and HSDP sharding. MoE expert grids are plan_rules_moe's; plan_rules applies both."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from autoplan.plan import RecomputeModule
from autoplan.plan_rules_base import Rule, divisors, row_int
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
    modules_mask,
)


def _shard_choices(dp: int) -> str:
    """The valid parallel.dp_shard values before `null`: the divisors of dp below it."""
    below = divisors(dp, proper=True)
    return f"from {below} or " if below else ""


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
    layers, most = row_int(t, "recompute_layers", i), int(chunk_min(t)[i])
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


def _microbatches_multiple_of_pp(name: str, schedule: int) -> Rule:
    """A looped schedule (interleaved 1F1B, torch's zero-bubble) runs micro-batches in rounds
    of pp, so their count per step must be a multiple of pp."""
    return Rule(
        name,
        lambda t, m: (col(t, "schedule") == schedule) & (col(t, "pp") > 1)
        & (_micro(t) % col(t, "pp") != 0),
        lambda t, i, m: f"pipeline.schedule={SCHEDULES[schedule].value} needs micro-batches "
        f"per step ({int(_micro(t)[i])}) to be a multiple of pp={row_int(t, 'pp', i)}",
    )


_MOE_ACT_BIT = modules_mask((RecomputeModule.MOE_ACT,))
_MOE_BIT = modules_mask((RecomputeModule.MOE,))

LAYOUT_RULES: tuple[Rule, ...] = (
    Rule(
        "tp-divides-heads",
        lambda t, m: m.num_heads % col(t, "tp") != 0,
        lambda t, i, m: f"parallel.tp={row_int(t, 'tp', i)} does not divide num_heads="
        f"{m.num_heads}; choose tp from {divisors(m.num_heads)}",
    ),
    Rule(
        "tp-divides-kv-heads",
        lambda t, m: m.kv_heads % col(t, "tp") != 0,
        lambda t, i, m: f"parallel.tp={row_int(t, 'tp', i)} does not divide num_kv_heads="
        f"{m.kv_heads}; choose tp from {divisors(m.kv_heads)}",
    ),
    Rule(
        "tp-divides-ffn",
        lambda t, m: m.ffn % col(t, "tp") != 0,
        lambda t, i, m: f"parallel.tp={row_int(t, 'tp', i)} does not divide ffn_hidden_size="
        f"{m.ffn}; choose a tp that divides it",
    ),
    Rule(
        "pp-vpp-divides-layers",
        lambda t, m: ~even_split_fits(m.num_layers, col(t, "pp"), col(t, "vpp")),
        lambda t, i, m: "parallel.pp * pipeline.vpp = "
        f"{row_int(t, 'pp', i) * row_int(t, 'vpp', i)} "
        f"does not divide num_layers={m.num_layers}; choose pp * vpp from "
        f"{divisors(m.num_layers)} or give pipeline.layers_per_stage",
    ),
    Rule(
        "batch-divides",
        lambda t, m: col(t, "gbs") % (col(t, "dp") * col(t, "mbs")) != 0,
        lambda t, i, m: _batch_message(row_int(t, "gbs", i), row_int(t, "dp", i),
                                       row_int(t, "mbs", i)),
    ),
    Rule(
        "microbatches-ge-pp",
        lambda t, m: (col(t, "pp") > 1) & (col(t, "schedule") != GPIPE)
        & (_micro(t) < col(t, "pp")),
        lambda t, i, m: f"pipeline.schedule={SCHEDULES[row_int(t, 'schedule', i)].value} needs "
        f"micro-batches per step ({int(_micro(t)[i])}) >= pp={row_int(t, 'pp', i)}; raise "
        "global_batch_size or lower micro_batch_size or dp",
    ),
    _microbatches_multiple_of_pp("interleaved-microbatches", INTERLEAVED),
    _microbatches_multiple_of_pp("zero-bubble-microbatches", ZERO_BUBBLE),
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
        lambda t, i, m: f"pipeline.vpp={row_int(t, 'vpp', i)} needs pp > 1 and schedule "
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
        lambda t, i, m: f"sequence_parallel=true: tp={row_int(t, 'tp', i)} does not divide the "
        f"per-cp-rank sequence seq_len/cp = {m.seq_len}/{row_int(t, 'cp', i)} = "
        f"{m.seq_len // row_int(t, 'cp', i)}; lower tp or cp",
    ),
    Rule(
        "cp-divides-seq",
        lambda t, m: (m.seq_len % (2 * col(t, "cp")) != 0) & (col(t, "cp") > 1),
        lambda t, i, m: f"parallel.cp={row_int(t, 'cp', i)}: model.seq_len={m.seq_len} is not "
        f"divisible by 2*cp={2 * row_int(t, 'cp', i)} (the load-balanced layout cuts it into 2*cp "
        f"chunks); pick a cp that divides {m.seq_len}/2",
    ),
    Rule(
        "offload-params-needs-zero3",
        lambda t, m: col(t, "offload_params") & (col(t, "zero_stage") != 3),
        lambda t, i, m: "offload.params=true needs zero_stage=3, got "
        f"{row_int(t, 'zero_stage', i)}",
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
        lambda t, i, m: f"parallel.pp * vpp = {row_int(t, 'pp', i) * row_int(t, 'vpp', i)} exceeds "
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
        f"of dp={row_int(t, 'dp', i)} below it (HSDP: dp / dp_shard replicas of each shard group); "
        f"choose {_shard_choices(row_int(t, 'dp', i))}null (shard over all of dp)",
    ),
    Rule(
        "dp-shard-needs-zero",
        lambda t, m: (dp_col(t, "dp_shard") > 0) & (col(t, "zero_stage") == 0),
        lambda t, i, m: f"parallel.dp_shard={int(dp_col(t, 'dp_shard')[i])} needs zero_stage "
        ">= 1 (ZeRO-0 shards nothing); set zero_stage or dp_shard: null",
    ),
)
