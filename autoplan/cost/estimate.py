"""Compose the cost terms into memory per GPU, step time by part, throughput, MFU and HFU.

`estimate_table` scores a whole table of candidates in one numpy pass; `estimate_plan` scores one
Plan and explains it (CostEstimate). Memory by part is step_memory.py's, time by part
step_time.py's; both price the plan as a named runtime runs it (runtimes.py), and every estimate
carries the error band of validated runs of its kind (error_band.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost import compute, memory, moe, runtime_rules
from autoplan.cost.error_band import (
    MfuCeiling,
    above_ceiling,
    band_and_bias_of_table,
    kind_of,
    mfu_ceiling,
    mfu_ceiling_array,
)
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import RuntimeTraits, load_runtime
from autoplan.cost.step_memory import (
    MEMORY_PARTS,
    activation_parts,
    memory_by_part,
    node_host_bytes,
)
from autoplan.cost.step_time import (
    ADAM_BYTES_PER_PARAM,
    TIME_PARTS,
    recompute_flops_per_step,
    time_by_part,
)
from autoplan.hardware import ClusterProfile, ClusterSpec, DeviceSpec, load_profile
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.plan_table import Table, plan_to_row

__all__ = ["ADAM_BYTES_PER_PARAM", "MEMORY_PARTS", "TIME_PARTS", "CostEstimate",
           "default_runtime", "estimate_plan", "estimate_table", "memory_misses", "row_estimate"]


def default_runtime(profile: ClusterProfile) -> RuntimeTraits:
    """autoplan's own runtime on the profile's kind of device (a CPU profile has compute_slots)."""
    return load_runtime(None, on_cpu=profile.is_cpu)


def estimate_table(
    table: Table, model: ModelSpec, profile: ClusterProfile, precision: str = "bf16",
    attention: str = "flash", runtime: RuntimeTraits | str | None = None,
) -> dict[str, np.ndarray]:
    """Score every row of `table` (see autoplan.plan_table.COLUMNS) as `runtime` runs it
    (default: autoplan's own runtime on this device); returns named columns: mem_<part> and
    mem_total / mem_host (bytes per GPU), time_<part> and time_step (seconds), tokens_per_s,
    model_flops_per_step, mfu, hfu, fits, band (the relative error band), bias (how much
    longer than priced the runs behind the band took, on average) and mfu_ceiling (the highest
    MFU predicted for the validated runs of the row's kind on this GPU; NaN where none)."""
    traits = load_runtime(runtime, on_cpu=profile.is_cpu)  # `autoplan` is the device's own
    eager = attention == "eager"
    r = rows_of(table, model, precision, traits)
    parts = activation_parts(model, r, eager, traits, precision)
    out = memory_by_part(model, profile, r, precision, eager, traits, parts)
    out.update(time_by_part(model, profile, r, precision, eager, traits, parts,
                            out.pop("mem_psi")))
    # MFU against the peak of the plan's own precision, an fp8 run's against the fp8 peak, as
    # NVIDIA states it (DGX Cloud recipes, Llama 3.1 70B: 54.1% in BF16 at 14.72 s, 36% in FP8
    # at 11.01 s, which only the 1979 TFLOP/s FP8 peak gives): so no fp8 plan reads above 100%
    # (a calibrated profile's fitted peak divided back out: MFU against the device's own)
    peak = profile.device.peak(precision) / profile.calibrated_compute
    per_sequence = (compute.model_flops_per_sequence(model) if model.moe is None and
                    model.mla is None else moe.model_flops_per_sequence(model))  # active params
    out["model_flops_per_step"] = r.gbs * per_sequence
    out["tokens_per_s"] = r.gbs * model.seq_len / out["time_step"]
    out["mfu"] = out["model_flops_per_step"] / (out["time_step"] * r.world * peak)
    out["hfu"] = (out["model_flops_per_step"] + recompute_flops_per_step(model, r, traits)) / (
        out["time_step"] * r.world * peak)
    # a file customising a preset keeps the preset's validated runs (RuntimeTraits.base)
    out["band"], out["bias"] = band_and_bias_of_table(traits.base or traits.name, r, profile,
                                                      model.moe is not None, precision)
    out["mfu_ceiling"] = mfu_ceiling_array(traits.base or traits.name, r.tp, r.pp, r.cp, profile,
                                           precision, model.moe is not None, model.seq_len)
    return out


@dataclass(frozen=True)
class CostEstimate:
    """The cost model's answer for one plan, in the shape `estimate --format json` prints."""

    feasible: bool
    reasons: tuple[str, ...]
    memory: dict[str, float]
    time: dict[str, float]
    tokens_per_s: float
    model_flops_per_step: float
    mfu: float
    hfu: float
    num_params: int
    dominant: str
    """The largest part of the step time."""
    days_to_train: float | None = None
    runtime: str = "autoplan-cuda"
    """The runtime-traits preset (or file's name) the plan was priced for."""
    error_band: float = 0.0
    """Relative error band of the step time: the validation residuals of runs of this kind
    (error_band.py); the step is step_time_s * (1 +- error_band)."""
    error_bias: float = 0.0
    """How much longer than priced the validated runs behind the band took, on average (mean
    measured / predicted - 1): which way the band leans. Not applied to step_time_s."""
    mfu_ceiling: MfuCeiling | None = None
    """The highest MFU the cost model predicts for the validated runs of this plan's runtime
    family, kind and context class on its GPU model (error_band.mfu_ceiling; None where there
    are too few): a plan predicted above it lies outside what the validation covers. Nothing
    caps the prediction with it."""

    @property
    def above_validated(self) -> bool:
        """Whether the predicted MFU lies above every validated run's of its kind on this GPU."""
        return self.mfu_ceiling is not None and bool(above_ceiling(self.mfu,
                                                                   self.mfu_ceiling.mfu))

    @property
    def step_time_s(self) -> float:
        return self.time["step"]

    @property
    def memory_total_bytes(self) -> float:
        return self.memory["total"]


def row_estimate(cols: dict[str, np.ndarray], i: int = 0) -> dict[str, Any]:
    """Row i of estimate_table's output as nested {memory, time, ...} floats."""
    mem = {k: float(cols[f"mem_{k}"][i]) for k in MEMORY_PARTS}
    mem["total"] = float(cols["mem_total"][i])
    mem["host_total"] = float(cols["mem_host"][i])
    tim = {k: float(cols[f"time_{k}"][i]) for k in TIME_PARTS}
    tim["step"] = float(cols["time_step"][i])
    return {
        "memory": mem, "time": tim, "tokens_per_s": float(cols["tokens_per_s"][i]),
        "model_flops_per_step": float(cols["model_flops_per_step"][i]),
        "mfu": float(cols["mfu"][i]), "hfu": float(cols["hfu"][i]),
        "dominant": max(TIME_PARTS, key=lambda k: tim[k]), "fits": bool(cols["fits"][i]),
        "band": float(cols["band"][i]), "bias": float(cols["bias"][i]),
    }


def estimate_plan(
    plan: Plan, cluster: ClusterSpec | None = None, model: ModelSpec | None = None,
    train_tokens: float | None = None, runtime: RuntimeTraits | str | None = None,
) -> CostEstimate:
    """Score one plan as `runtime` runs it (default: autoplan's own runtime on the cluster's
    device): validity reasons, memory by part, time by part, throughput, MFU, error band."""
    from autoplan.cost.params import total_params
    from autoplan.plan_rules import validate_plan

    model = model or plan.model_spec()
    cluster = cluster or ClusterSpec(load_profile(plan.cluster.profile), plan.cluster.num_gpus)
    reasons = validate_plan(plan, model, cluster)
    traits = load_runtime(runtime, on_cpu=cluster.profile.is_cpu)  # as estimate_table
    reasons += runtime_refusals(plan, traits, model, cluster.profile.device)
    precision = plan.precision.value
    if precision not in cluster.profile.device.peak_flops_per_s:
        precision = next(iter(cluster.profile.device.peak_flops_per_s))  # reason already given
    cols = estimate_table(plan_to_row(plan, model), model, cluster.profile, precision,
                          plan.attention.value, traits)
    row = row_estimate(cols)
    capacity = cluster.profile.device.memory_bytes
    total = row["memory"]["total"]
    if total > capacity:
        reasons.append(
            f"needs {total / 2**30:.1f} GiB per GPU of {capacity / 2**30:.1f} GiB "
            f"(short by {short_by(total - capacity)})")
    host_need = float(node_host_bytes(cluster.profile, total, row["memory"]["host_total"],
                                      cluster.num_gpus))
    host_have = cluster.profile.host.memory_bytes
    if host_need > host_have:
        what = "its ranks" if cluster.profile.is_cpu else "offloaded states"
        reasons.append(
            f"{what} need {host_need / 2**30:.1f} GiB of host memory per node of "
            f"{host_have / 2**30:.1f} GiB (short by {short_by(host_need - host_have)})")
    row["memory"]["capacity"] = float(capacity)
    row["memory"]["shortfall"] = float(max(0.0, total - capacity))
    row["memory"]["tight_by"] = float(memory.tight_by_bytes(total, row["memory"]["allocator"],
                                                            capacity))
    days = None
    if train_tokens is not None:
        days = train_tokens / row["tokens_per_s"] / 86400.0
    return CostEstimate(
        feasible=not reasons, reasons=tuple(reasons), memory=row["memory"], time=row["time"],
        tokens_per_s=row["tokens_per_s"], model_flops_per_step=row["model_flops_per_step"],
        mfu=row["mfu"], hfu=row["hfu"], num_params=total_params(model), dominant=row["dominant"],
        days_to_train=days, runtime=traits.name, error_band=row["band"],
        error_bias=row["bias"],
        mfu_ceiling=mfu_ceiling(traits.base or traits.name,
                                int(kind_of(plan.parallel.tp, plan.parallel.pp, plan.parallel.cp,
                                            model.moe is not None)),
                                cluster.profile, precision, model.seq_len),
    )


def short_by(nbytes: float) -> str:
    """A shortfall as GiB with one decimal, or MiB where that would read 0.0 GiB."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 0.05 * 2**30 else f"{nbytes / 2**20:.0f} MiB"


def memory_misses(plan: Plan, cluster: ClusterSpec, model: ModelSpec,
                  runtime: RuntimeTraits | str | None = None) -> tuple[CostEstimate, list[str]]:
    """The plan priced as `runtime` runs it (default: autoplan's own runtime on the profile's
    device, as `autoplan estimate` prices it) and why it does not fit there: its reasons less
    the runtime's refusals, which the runtime rules report themselves. On a plan that passes
    the plan rules that is memory only (device, and host per node). The check `autoplan
    train`'s launcher makes (runtime/launch.memory_preflight) and an export makes of what it
    writes (export/cli.run_export: a launcher's job as autoplan's runtime runs it, a
    framework's config as its engine does)."""
    est = estimate_plan(plan, cluster, model, runtime=runtime)
    traits = load_runtime(runtime, on_cpu=cluster.profile.is_cpu)
    # worded as estimate_plan worded them
    other = set(runtime_refusals(plan, traits, model, cluster.profile.device))
    return est, [r for r in est.reasons if r not in other]


def runtime_refusals(plan: Plan, traits: RuntimeTraits, model: ModelSpec | None = None,
                     device: DeviceSpec | None = None) -> list[str]:
    """What of the plan the runtime cannot run (its schedules, ZeRO stages, offload, partial
    recompute, HSDP and reduce dtypes: autoplan.cost.runtime_rules), on `device` where given;
    `model`: the plan's, where the caller has loaded it."""
    return runtime_rules.refusals(plan, traits, model, device)
