"""What the kernels a runtime calls cannot run: Transformer Engine's and Megatron-Core's grouped
GEMM's limits by precision, attention, context parallelism and model (engine_limits), and where a
fused attention kernel runs by device (fused_attention_on, DEVICE_RULES). Apart from
runtime_rules.py, which applies them with the runtime's other rules, because the megatron
exporter and importers and the planner's attention choice ask them on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import DeviceSpec
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, Precision
from autoplan.plan_table import PRECISIONS, Table, dtype_col, eager_col, plan_to_row


def engine_limits(t: Table, m: ModelSpec) -> list[tuple[Any, str]]:
    """What Transformer Engine and Megatron-Core's grouped GEMM cannot run: (rows, why) per
    limit, the why written for the first row (messages are for one-plan tables). Sources:
    TE's get_attention_backend (FusedAttention takes bf16/fp16 inputs; UnfusedDotProduct-
    Attention "does not support context parallelism"), its context_parallel.py (MLA only with
    cp_comm_type p2p or a2a+p2p), Megatron-LM's validate_args (`if args.moe_grouped_gemm:
    assert args.bf16`, and `not args.fp16` with expert parallelism)."""
    dtype, eager = dtype_col(t, t["pp"]), eager_col(t, t["pp"])
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
    megatron exporter refuses with these; runtime_rules keeps searches from them for every
    runtime on Transformer Engine)."""
    row = plan_to_row(plan, model)
    return [why for rows, why in engine_limits(row, model) if bool(np.asarray(rows)[0])]


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
    without fused attention anywhere is refused by runtime_rules.RULES, on every device)."""
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


def device_refusals(plan: Plan, traits: RuntimeTraits, model: ModelSpec,
                    device: DeviceSpec) -> list[str]:
    """What of one plan the runtime cannot run on `device` alone (DEVICE_RULES), a line each."""
    row = plan_to_row(plan, model)
    return [rule.message(traits, device) for rule in DEVICE_RULES
            if bool(np.asarray(rule.breaks(row, traits, model, device))[0])]
