"""What a runtime cannot run, as rules over plan tables (autoplan.plan_table columns).

One set for both users, as autoplan.plan_rules is for plan validity: the search masks whole
tables with `lacking` (search --runtime T keeps to plans T runs, so its winner exports), and
`estimate` names what one plan breaks with `refusals` (the plan as a one-row table). The
recompute rules live in recompute_rules, the kernels' limits (Transformer Engine, fused attention
by device) in kernel_rules; RULES, lacking and refusals apply them here with the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost import kernel_rules, recompute_rules
from autoplan.cost.recompute_rules import row_value as _v
from autoplan.cost.rows import microbatches
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import DeviceSpec
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, Precision, ReduceDtype
from autoplan.plan_table import (
    PRECISIONS,
    REDUCE_DTYPES,
    SCHEDULES,
    dtype_col,
    eager_col,
    plan_to_row,
)

Table = dict[str, np.ndarray]


@dataclass(frozen=True)
class RuntimeRule:
    breaks: Callable[[Table, RuntimeTraits, ModelSpec], Any]
    """Rows the runtime cannot run (a boolean array over the table)."""
    message: Callable[[Table, RuntimeTraits, ModelSpec], str]
    """Why, for a one-row table."""


def _schedule(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    codes = [i for i, s in enumerate(SCHEDULES) if s.value in rt.schedules]
    return (t["pp"] > 1) & ~np.isin(t["schedule"], codes)


def _offload_mode(t: Table) -> tuple[bool, bool, int]:
    return bool(t["offload_optimizer"][0]), bool(t["offload_params"][0]), _v(t, "zero_stage")


def _offload(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    opt, par = t["offload_optimizer"].astype(bool), t["offload_params"].astype(bool)
    bad = np.zeros(np.shape(opt), dtype=bool)
    for o, p in ((True, False), (False, True), (True, True)):
        if rt.offload_refusal(o, p) is not None:
            bad |= (opt == o) & (par == p)
    # an optimizer offload at a ZeRO stage the runtime does not offload with (at ZeRO-0 the
    # plan rule offload-optimizer-needs-zero refuses it for every runtime: said once, there)
    zero = t["zero_stage"]
    return bad | (opt & (zero >= 1) & ~np.isin(zero, list(rt.offload_zero_stages)))


def _reduce_codes(rt: RuntimeTraits) -> list[int]:
    """grad_reduce codes the runtime runs; 0 (null) is its own default."""
    return [0, *(REDUCE_DTYPES.index(ReduceDtype(d)) for d in rt.grad_reduce_dtypes)]


def _reduce_dtype(t: Table) -> str:
    return REDUCE_DTYPES[_v(t, "grad_reduce")].value  # type: ignore[union-attr]


def _split_codes(rt: RuntimeTraits) -> list[int]:
    """Codes of column `split` (search_space.Split in order) the runtime runs."""
    from autoplan.search_space import Split

    return [i for i, s in enumerate(Split) if s.value in rt.layer_splits]


def _split(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    if "split" not in t:  # one plan's row (plan_to_row): its exporter names the split
        return np.zeros(np.shape(t["pp"]), dtype=bool)
    return (t["pp"] > 1) & ~np.isin(t["split"], _split_codes(rt))


def _microbatches(t: Table) -> Any:
    """Micro-batches per step, as rows.rows_of counts them."""
    return microbatches(t["gbs"], t["dp"], t["mbs"])


def _dualpipe(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    """DualPipe's step() asserts an even rank count and an even number of micro-batches of at
    least twice it (deepseek-ai/DualPipe dualpipe/dualpipe.py), and runs one chunk per stage
    pair: rows with a pipeline that break any of these."""
    if not rt.dualpipe:
        return np.zeros(np.shape(t["pp"]), dtype=bool)
    mb = _microbatches(t)
    return (t["pp"] > 1) & ((t["pp"] % 2 != 0) | (t["vpp"] != 1) | (mb % 2 != 0)
                            | (mb < 2 * t["pp"]))


def _degrees(t: Table) -> dict[str, np.ndarray]:
    """The model-parallel degrees of a table, expert tensor parallelism under ep (a runtime
    without expert parallelism splits no expert)."""
    ones = np.ones(np.shape(t["pp"]), dtype=np.int64)
    return {"tp": t.get("tp", ones), "pp": t["pp"], "cp": t.get("cp", ones),
            "ep": t.get("ep", ones), "etp": t.get("etp", ones)}


def _lacks(rt: RuntimeTraits, dim: str) -> bool:
    return (dim[1:] if dim == "etp" else dim) not in rt.parallel_dims


def _parallel(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    bad = np.zeros(np.shape(t["pp"]), dtype=bool)
    for dim, degree in _degrees(t).items():
        if _lacks(rt, dim):
            bad |= np.asarray(degree) > 1
    return bad


def _parallel_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    used = [f"{d}={int(np.asarray(v)[0])}" for d, v in _degrees(t).items()
            if _lacks(rt, d) and int(np.asarray(v)[0]) > 1]
    runs = ", ".join(rt.parallel_dims) or "data parallelism and ZeRO sharding only"
    return f"runtime {rt.name} cannot split the model by {', '.join(used)} (it runs {runs})"


def _features(m: ModelSpec) -> list[str]:
    """The model's features a runtime needs code for (RuntimeTraits.model_code)."""
    return [f for f, used in (("moe", m.moe is not None), ("mla", m.mla is not None),
                              ("mtp", bool(m.mtp_layers))) if used]


def _model_code(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    lacking = [f for f in _features(m) if f not in rt.model_code]
    return np.full(np.shape(t["pp"]), bool(lacking))


def _model_code_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    names = {"moe": "routed experts", "mla": "latent attention", "mtp": "multi-token prediction"}
    lacking = [names[f] for f in _features(m) if f not in rt.model_code]
    return (f"runtime {rt.name} has no model code for {', '.join(lacking)} (model {m.name}): "
            "price it as megatron or torchtitan")


def _ddp(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    if not rt.ddp_one_dimensional:
        return np.zeros(np.shape(t["pp"]), dtype=bool)
    d = _degrees(t)
    split = (d["tp"] > 1) | (d["pp"] > 1) | (d["ep"] > 1) | (d["etp"] > 1)
    dp = t.get("dp", np.ones(np.shape(t["pp"]), dtype=np.int64))
    return (t["zero_stage"] == 0) & (((dp > 1) & split) | (d["cp"] > 1))


def _dtype(t: Table) -> Any:
    return dtype_col(t, t["pp"])


def _mixed_without_fsdp(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    if not rt.mixed_precision_needs_fsdp:
        return np.zeros(np.shape(t["pp"]), dtype=bool)
    d = _degrees(t)
    dp = t.get("dp", np.ones(np.shape(t["pp"]), dtype=np.int64))
    fsdp = ((t["zero_stage"] >= 2) & (dp > 1)) | (d["cp"] > 1)
    return (_dtype(t) != PRECISIONS.index(Precision.FP32)) & ~fsdp


def _mixed_fix(t: Table) -> str:
    """The fix of _mixed_without_fsdp: FSDP keeps the plan's precision; fp32 needs none, but
    for an fp8 plan that gives up fp8 (and bf16, which needs FSDP too) as well."""
    if PRECISIONS[int(_dtype(t)[0])] == Precision.FP8:
        return ("shard over dp (zero_stage 2 or 3 with dp > 1) to train it in fp8; only "
                "precision fp32 runs without FSDP (bf16 needs it as fp8 does)")
    return "shard over dp (zero_stage 2 or 3 with dp > 1), or set precision fp32"


def _precision(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    codes = [i for i, p in enumerate(PRECISIONS) if p.value in rt.precisions]
    return ~np.isin(_dtype(t), codes)


def _te(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    bad = np.zeros(np.shape(t["pp"]), dtype=bool)
    if rt.transformer_engine:
        for rows, _ in kernel_rules.engine_limits(t, m):
            bad |= np.asarray(rows, dtype=bool)
    return bad


def _te_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    why = [w for rows, w in kernel_rules.engine_limits(t, m) if bool(np.asarray(rows)[0])]
    return f"runtime {rt.name}: " + "; ".join(why)


def _one_stage(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    codes = [i for i, s in enumerate(SCHEDULES) if s.value in rt.multi_stage_schedules]
    return (t["pp"] > 1) & (t["vpp"] < 2) & np.isin(t["schedule"], codes)


RULES: tuple[RuntimeRule, ...] = (
    RuntimeRule(_model_code, _model_code_message),
    RuntimeRule(_precision, lambda t, rt, m: (
        f"runtime {rt.name} has no {PRECISIONS[int(_dtype(t)[0])].value} training (it runs "
        f"{', '.join(rt.precisions)})")),
    RuntimeRule(_mixed_without_fsdp, lambda t, rt, m: (
        f"runtime {rt.name} trains in {PRECISIONS[int(_dtype(t)[0])].value} only through FSDP "
        f"(zero_stage >= 2 with dp > 1, or cp > 1; got zero_stage={_v(t, 'zero_stage')}, "
        f"dp={_v(t, 'dp')}, cp={_v(t, 'cp')}): without it, it trains in fp32 beside tp or pp "
        f"and under autocast otherwise; {_mixed_fix(t)}")),
    RuntimeRule(_te, _te_message),
    RuntimeRule(_parallel, _parallel_message),
    RuntimeRule(_ddp, lambda t, rt, m: (
        f"runtime {rt.name} replicates (ZeRO-0, DDP) only as the sole parallelism and shards "
        f"whenever cp > 1 (got dp={_v(t, 'dp')}, tp={_v(t, 'tp')}, pp={_v(t, 'pp')}, "
        f"cp={_v(t, 'cp')}): set zero_stage 2 or 3")),
    RuntimeRule(recompute_rules.policy, recompute_rules.policy_message),
    RuntimeRule(recompute_rules.selective_without_model_code,
                recompute_rules.selective_without_model_code_message),
    RuntimeRule(_schedule, lambda t, rt, m: (
        f"runtime {rt.name} has no {SCHEDULES[_v(t, 'schedule')].value} schedule "
        f"(it runs {', '.join(rt.schedules)})")),
    RuntimeRule(_one_stage, lambda t, rt, m: (
        f"runtime {rt.name} runs {SCHEDULES[_v(t, 'schedule')].value} only with several "
        f"stages per rank (vpp={_v(t, 'vpp')}; set pipeline.vpp 2 or more)")),
    RuntimeRule(lambda t, rt, m: ~np.isin(t["zero_stage"], list(rt.zero_stages)),
                lambda t, rt, m: (f"runtime {rt.name} has no ZeRO stage {_v(t, 'zero_stage')} "
                                  f"(it runs {', '.join(map(str, rt.zero_stages))})")),
    RuntimeRule(recompute_rules.partial_recompute, recompute_rules.partial_recompute_message),
    RuntimeRule(lambda t, rt, m: (t["zero_stage"] >= 2) & (t["pp"] > 1)
                & (not rt.sharded_zero_with_pipeline),
                lambda t, rt, m: (f"runtime {rt.name} has no ZeRO stage {_v(t, 'zero_stage')} "
                                  f"with a pipeline (pp={_v(t, 'pp')}; its ZeRO-2/3 runs with "
                                  "pp=1)")),
    RuntimeRule(_offload, lambda t, rt, m: str(rt.offload_refusal(*_offload_mode(t)))),
    RuntimeRule(lambda t, rt, m: ~np.isin(t["grad_reduce"], _reduce_codes(rt))
                if "grad_reduce" in t else np.zeros(np.shape(t["pp"]), dtype=bool),
                lambda t, rt, m: (f"runtime {rt.name} cannot reduce gradients in "
                                  f"{_reduce_dtype(t)} (it reduces in "
                                  f"{', '.join(rt.grad_reduce_dtypes)})")),
    RuntimeRule(lambda t, rt, m: (t["dp_shard"] > 0)
                & ~np.isin(t["zero_stage"], list(rt.hsdp_zero_stages))
                if "dp_shard" in t else np.zeros(np.shape(t["pp"]), dtype=bool),
                lambda t, rt, m: (f"runtime {rt.name} has no HSDP (parallel.dp_shard) at ZeRO "
                                  f"stage {_v(t, 'zero_stage')} (it runs it at: "
                                  f"{', '.join(map(str, rt.hsdp_zero_stages)) or 'none'})")),
    RuntimeRule(_dualpipe, lambda t, rt, m: (
        f"runtime {rt.name} runs a pipeline as DualPipe, which needs an even pp, vpp 1 and an "
        f"even number of micro-batches of at least 2 x pp (got pp={_v(t, 'pp')}, "
        f"vpp={_v(t, 'vpp')}, {int(_microbatches(t)[0])} micro-batches: "
        "batch.global_batch_size / (dp x micro_batch_size))")),
    RuntimeRule(lambda t, rt, m: (t.get("tp", np.ones(np.shape(t["pp"]), dtype=np.int64)) > 1)
                & ~np.asarray(t["sp"], dtype=bool) & rt.sequence_parallel_with_tp
                if "sp" in t else np.zeros(np.shape(t["pp"]), dtype=bool),
                lambda t, rt, m: (f"runtime {rt.name} shards the norms over tp whenever tp > 1 "
                                  f"(sequence parallelism; got tp={_v(t, 'tp')}, "
                                  "sequence_parallel false): set sequence_parallel true")),
    RuntimeRule(lambda t, rt, m: np.asarray(t["sp"], dtype=bool) & (not rt.has_sequence_parallel)
                if "sp" in t else np.zeros(np.shape(t["pp"]), dtype=bool),
                lambda t, rt, m: (f"runtime {rt.name} has no sequence parallelism (Megatron-LM "
                                  "added it in 2022, Korthikanti et al.): set sequence_parallel "
                                  "false, or price it as megatron-2022 or later")),
    RuntimeRule(recompute_rules.modules, recompute_rules.modules_message),
    RuntimeRule(_split, lambda t, rt, m: (
        f"runtime {rt.name} runs the layer splits {', '.join(rt.layer_splits)} only")),
    RuntimeRule(lambda t, rt, m: ~eager_col(t, t["pp"]) & (not rt.fused_attention),
                lambda t, rt, m: (f"runtime {rt.name} computes attention unfused only "
                                  "(Megatron-LM took FlashAttention in 2023, after its 2021 and "
                                  "2022 releases): set attention eager, or price it as megatron")),
)


def lacking(t: Table, traits: RuntimeTraits, model: ModelSpec,
            device: DeviceSpec | None = None) -> np.ndarray:
    """Rows of a plan table that break any of the runtime's rules (for autoplan's own runtime
    also plan_rules.RUNTIME_RULES, what `autoplan train` refuses), and with `device` its rules
    for that GPU."""
    bad = np.zeros(np.shape(t["pp"]), dtype=bool)
    for rule in RULES:
        bad |= np.asarray(rule.breaks(t, traits, model), dtype=bool)
    if device is not None:
        for device_rule in kernel_rules.DEVICE_RULES:
            bad |= np.asarray(device_rule.breaks(t, traits, model, device), dtype=bool)
    if traits.own_runtime_rules:
        from autoplan.plan_rules import RUNTIME_RULES, violations_of

        bad |= violations_of(RUNTIME_RULES, t, model).any(axis=1)
    return bad


def refusals(plan: Plan, traits: RuntimeTraits, model: ModelSpec | None = None,
             device: DeviceSpec | None = None) -> list[str]:
    """What of one plan the runtime cannot run (on `device`, where given), a line per rule it
    breaks."""
    model = model or plan.model_spec()
    row = plan_to_row(plan, model)
    out = [rule.message(row, traits, model) for rule in RULES
           if bool(np.asarray(rule.breaks(row, traits, model))[0])]
    if device is not None:
        out += kernel_rules.device_refusals(plan, traits, model, device)
    if traits.own_runtime_rules:
        from autoplan.plan_rules import runtime_limits

        out += runtime_limits(plan, model)
    return out
