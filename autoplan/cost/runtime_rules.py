"""What a runtime cannot run, as rules over plan tables (autoplan.plan_table columns).

One set for both users, as autoplan.plan_rules is for plan validity: the search masks whole
tables with `lacking` (search --runtime T keeps to plans T runs, so its winner exports), and
`estimate` names what one plan breaks with `refusals` (the plan as a one-row table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost.rows import microbatches
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import DeviceSpec
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, Precision, ReduceDtype
from autoplan.plan_table import (
    PRECISIONS,
    RC_BLOCK,
    RC_FULL,
    RC_MODULES,
    RC_NONE,
    RC_SELECTIVE,
    RECOMPUTE,
    REDUCE_DTYPES,
    SCHEDULES,
    dp_col,
    dtype_col,
    eager_col,
    mask_modules,
    modules_mask,
    plan_to_row,
)

Table = dict[str, np.ndarray]


@dataclass(frozen=True)
class RuntimeRule:
    breaks: Callable[[Table, RuntimeTraits, ModelSpec], Any]
    """Rows the runtime cannot run (a boolean array over the table)."""
    message: Callable[[Table, RuntimeTraits, ModelSpec], str]
    """Why, for a one-row table."""


def _v(t: Table, col: str) -> int:
    return int(t[col][0])


def _schedule(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    codes = [i for i, s in enumerate(SCHEDULES) if s.value in rt.schedules]
    return (t["pp"] > 1) & ~np.isin(t["schedule"], codes)


def _partial_recompute(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
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


def _partial_recompute_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    n = _v(t, "recompute_layers")
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


def _modules_lacking(rt: RuntimeTraits) -> int:
    """Bits of column rc_modules (plan_table.RC_MODULES) naming modules the runtime cannot
    recompute by name (RuntimeTraits.recompute_modules)."""
    return modules_mask(tuple(m for m in RC_MODULES if m.value not in rt.recompute_modules))


def _modules(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    if "rc_modules" not in t:  # a table that tries no module sets
        return np.zeros(np.shape(t["pp"]), dtype=bool)
    return (np.asarray(t["rc_modules"]) & _modules_lacking(rt)) > 0


def _modules_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    names = mask_modules(_v(t, "rc_modules") & _modules_lacking(rt)) or ()
    has = ", ".join(rt.recompute_modules) or "none"
    return (f"runtime {rt.name} cannot recompute {', '.join(m.value for m in names)} by module "
            f"(recompute.modules; it names: {has}): drop them, or use selective without modules")


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


def _engine(t: Table, m: ModelSpec) -> list[tuple[Any, str]]:
    """What Transformer Engine and Megatron-Core's grouped GEMM cannot run: (rows, why) per
    limit, the why written for the first row (messages are for one-plan tables). Sources:
    TE's get_attention_backend (FusedAttention takes bf16/fp16 inputs; UnfusedDotProduct-
    Attention "does not support context parallelism"), its context_parallel.py (MLA only with
    cp_comm_type p2p or a2a+p2p), Megatron-LM's validate_args (`if args.moe_grouped_gemm:
    assert args.bf16`, and `not args.fp16` with expert parallelism)."""
    dtype, eager = _dtype(t), eager_col(t, t["pp"])
    cp = np.asarray(t.get("cp", np.ones(np.shape(t["pp"]), dtype=np.int64)))
    first = PRECISIONS[int(dtype[0])].value if np.size(dtype) else "bf16"
    c = int(cp[0]) if np.size(cp) else 1
    sixteen = [PRECISIONS.index(Precision.BF16), PRECISIONS.index(Precision.FP8)]
    return [
        ((dtype == PRECISIONS.index(Precision.FP32)) & ~eager,
         "precision fp32 with attention flash: Transformer Engine's fused attention runs in 16 "
         "bits only; use bf16, or attention eager"),
        (eager & (cp > 1),
         f"attention eager with cp={c}: Transformer Engine runs context parallelism through "
         "fused attention only; use attention flash or cp=1"),
        ((cp > 1) & (m.mla is not None),
         f"model.mla with cp={c}: Transformer Engine runs latent attention's context "
         "parallelism as its p2p ring only, not the K/V all-gather priced and exported; use "
         "cp=1"),
        (~np.isin(dtype, sixteen) & (m.moe is not None),
         f"precision {first} with experts: Megatron's grouped expert GEMM (--moe-grouped-gemm) "
         "runs in bf16 only; use bf16 or fp8"),
    ]


def engine_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What of one plan Transformer Engine and Megatron-Core cannot run, a line per limit (the
    megatron exporter refuses with these; the runtime rule below keeps searches from them)."""
    row = plan_to_row(plan, model)
    return [why for rows, why in _engine(row, model) if bool(np.asarray(rows)[0])]


def _te(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    bad = np.zeros(np.shape(t["pp"]), dtype=bool)
    if rt.transformer_engine:
        for rows, _ in _engine(t, m):
            bad |= np.asarray(rows, dtype=bool)
    return bad


def _te_message(t: Table, rt: RuntimeTraits, m: ModelSpec) -> str:
    why = [w for rows, w in _engine(t, m) if bool(np.asarray(rows)[0])]
    return f"runtime {rt.name}: " + "; ".join(why)


def _recompute(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    codes = [i for i, p in enumerate(RECOMPUTE) if p.value in rt.recompute_policies]
    return ~np.isin(t["recompute"], codes)


def _selective_without_model_code(t: Table, rt: RuntimeTraits, m: ModelSpec) -> Any:
    return (rt.selective_needs_model_parallel & (t["recompute"] == RC_SELECTIVE)
            & (t["tp"] == 1) & (t["pp"] == 1))


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
    RuntimeRule(_recompute, lambda t, rt, m: (
        f"runtime {rt.name} has no {RECOMPUTE[_v(t, 'recompute')].value} recompute "
        f"(it runs {', '.join(rt.recompute_policies)})")),
    RuntimeRule(_selective_without_model_code, lambda t, rt, m: (
        f"runtime {rt.name} recomputes selectively only through Megatron's model code, with "
        f"tp or pp above 1 (got tp=1, pp=1); its ZeRO config checkpoints whole blocks: set "
        f"recompute.policy full or none")),
    RuntimeRule(_schedule, lambda t, rt, m: (
        f"runtime {rt.name} has no {SCHEDULES[_v(t, 'schedule')].value} schedule "
        f"(it runs {', '.join(rt.schedules)})")),
    RuntimeRule(_one_stage, lambda t, rt, m: (
        f"runtime {rt.name} runs {SCHEDULES[_v(t, 'schedule')].value} only with several "
        f"stages per rank (vpp={_v(t, 'vpp')}; set pipeline.vpp 2 or more)")),
    RuntimeRule(lambda t, rt, m: ~np.isin(t["zero_stage"], list(rt.zero_stages)),
                lambda t, rt, m: (f"runtime {rt.name} has no ZeRO stage {_v(t, 'zero_stage')} "
                                  f"(it runs {', '.join(map(str, rt.zero_stages))})")),
    RuntimeRule(_partial_recompute, _partial_recompute_message),
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
    RuntimeRule(_modules, _modules_message),
    RuntimeRule(_split, lambda t, rt, m: (
        f"runtime {rt.name} runs the layer splits {', '.join(rt.layer_splits)} only")),
    RuntimeRule(lambda t, rt, m: ~eager_col(t, t["pp"]) & (not rt.fused_attention),
                lambda t, rt, m: (f"runtime {rt.name} computes attention unfused only "
                                  "(Megatron-LM took FlashAttention in 2023, after its 2021 and "
                                  "2022 releases): set attention eager, or price it as megatron")),
)


def pre_ampere(device: DeviceSpec) -> bool:
    """An NVIDIA GPU older than Ampere (compute capability below 8.0: V100, T4): its profile
    lists no bf16 peak, as bf16 tensor cores came with Ampere (V100 datasheet: fp16 and fp32;
    A100 and later: bf16). A CPU profile lists one and is not pre-Ampere."""
    return "bf16" not in device.peak_flops_per_s


def fused_attention_on(rt: RuntimeTraits, dev: DeviceSpec) -> bool:
    """Whether the runtime runs a fused attention kernel on the device: not where it has none
    (RuntimeTraits.fused_attention), nor under Transformer Engine on a GPU older than Ampere.
    TE's fused backends (cuDNN's FusedAttention and FlashAttention-2) need compute capability
    8.0 or later (FlashAttention-2's README: Ampere, Ada or Hopper; TE's get_attention_backend
    checks the same) and TE computes attention unfused below it, which `attention: flash` does
    not price. PyTorch's SDPA (autoplan's runtime, torchtitan) falls back to its
    memory-efficient kernel there, still fused."""
    return rt.fused_attention and not (rt.transformer_engine and pre_ampere(dev))


def _te_pre_ampere(t: Table, rt: RuntimeTraits, m: ModelSpec, dev: DeviceSpec) -> Any:
    """Flash-attention rows under Transformer Engine on a GPU older than Ampere (a runtime
    without fused attention anywhere is refused by RULES, on every device)."""
    return (~eager_col(t, t["pp"])) & (rt.fused_attention and not fused_attention_on(rt, dev))


@dataclass(frozen=True)
class DeviceRule:
    breaks: Callable[[Table, RuntimeTraits, ModelSpec, DeviceSpec], Any]
    """Rows the runtime cannot run on the device."""
    message: Callable[[RuntimeTraits, DeviceSpec], str]
    """Why."""


DEVICE_RULES: tuple[DeviceRule, ...] = (
    DeviceRule(_te_pre_ampere, lambda rt, dev: (
        f"runtime {rt.name}: attention flash on {dev.name}, older than Ampere (no bf16 tensor "
        "cores): Transformer Engine's fused attention needs compute capability 8.0 or later "
        "and computes attention unfused there; set attention eager")),
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
        for device_rule in DEVICE_RULES:
            bad |= np.asarray(device_rule.breaks(t, traits, model, device), dtype=bool)
    if traits.own_runtime_rules:
        from autoplan.plan_rules import RUNTIME_RULES, violations_of

        bad |= violations_of(RUNTIME_RULES, t, model).any(axis=1)
    return bad


def device_refusals(plan: Plan, traits: RuntimeTraits, model: ModelSpec,
                    device: DeviceSpec) -> list[str]:
    """What of one plan the runtime cannot run on `device` alone (DEVICE_RULES), a line each."""
    row = plan_to_row(plan, model)
    return [rule.message(traits, device) for rule in DEVICE_RULES
            if bool(np.asarray(rule.breaks(row, traits, model, device))[0])]


def refusals(plan: Plan, traits: RuntimeTraits, model: ModelSpec | None = None,
             device: DeviceSpec | None = None) -> list[str]:
    """What of one plan the runtime cannot run (on `device`, where given), a line per rule it
    breaks."""
    model = model or plan.model_spec()
    row = plan_to_row(plan, model)
    out = [rule.message(row, traits, model) for rule in RULES
           if bool(np.asarray(rule.breaks(row, traits, model))[0])]
    if device is not None:
        out += device_refusals(plan, traits, model, device)
    if traits.own_runtime_rules:
        from autoplan.plan_rules import runtime_limits

        out += runtime_limits(plan, model)
    return out
