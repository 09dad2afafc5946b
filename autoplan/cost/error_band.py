"""How sure the cost model is: an error band per kind of plan, from validation residuals.

`benchmarks/published_accuracy.py --write-bands` predicts published measured runs, leaving each
source out of nothing (nothing is fitted to them), and writes per group (runtime family x kind
of parallelism x scale) a one-sided 95% upper bound on the root-mean-square relative step-time
error, rms * sqrt(n / chi2_05(n)) for n runs (3 runs: 3x their RMS; 16: 1.4x), to
error_bands.yaml beside this file, with each group's bias: the mean of measured / predicted - 1
over its runs (+0.08: they took 8% longer than priced). The bias says which way the band
leans; nothing adds it to a prediction (that would fit the model to the runs). A group with
fewer than MIN_RUNS runs takes its runtime family's band and bias, and a family with none the
stated default band and no bias.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import yaml

from autoplan.cost.rows import Rows
from autoplan.hardware import ClusterProfile

MIN_RUNS = 3
"""Fewest validated runs a group needs for a band of its own."""
KINDS = ("dp", "tp", "3d", "moe")
"""dp: data parallel / ZeRO only; tp: tensor (and context) parallel without a pipeline; 3d: a
pipeline with anything else; moe: any layout of a mixture-of-experts model (its all-to-all,
routing and grouped GEMMs make it a kind of its own, with its own residuals)."""
SCALES = ("node", "cluster", "large")
"""node: within one node; cluster: up to 1,024 GPUs; large: more."""


def family(runtime: str) -> str:
    """Runtimes that share kernels and schedules share validation runs. autoplan's CUDA runtime
    is built as torchtitan is (FSDP2, DTensor, torch.distributed.pipelining, eager kernels):
    until runs of its own on GPUs are validated it takes torchtitan's residuals."""
    if runtime in ("megatron", "megatron-2021", "megatron-2022", "megatron-deepep",
                   "megatron-allgather", "nemo"):
        return "megatron"
    if runtime in ("autoplan-cuda", "torchtitan-0.3"):
        return "torchtitan"
    return runtime


def kind_of(tp: Any, pp: Any, cp: Any, moe: bool = False) -> np.ndarray:
    tp, pp, cp = np.asarray(tp), np.asarray(pp), np.asarray(cp)
    dense = np.where(pp > 1, 2, np.where((tp > 1) | (cp > 1), 1, 0))
    return np.where(moe, 3, dense)


def scale_of(world: Any, gpus_per_node: int) -> np.ndarray:
    world = np.asarray(world)
    return np.where(world <= gpus_per_node, 0, np.where(world <= 1024, 1, 2))


@functools.cache
def _bands() -> dict[str, Any]:
    text = resources.files("autoplan.cost").joinpath("error_bands.yaml").read_text()
    data = yaml.safe_load(text)
    return data if isinstance(data, dict) else {}


def _table(field: str) -> tuple[float, dict[str, float], dict[tuple[str, int, int], float]]:
    """(default, per family, per (family, kind, scale)) of one field of error_bands.yaml
    (`band` or `bias`), from entries of at least MIN_RUNS runs."""
    data = _bands()
    default = float(data.get("default", 0.25)) if field == "band" else 0.0
    families = {str(k): float(v[field]) for k, v in (data.get("families") or {}).items()
                if v.get("runs", 0) >= MIN_RUNS and v.get(field) is not None}
    groups = {}
    for g in data.get("groups") or []:
        if g.get("runs", 0) >= MIN_RUNS and g.get(field) is not None:
            key = (str(g["family"]), KINDS.index(g["kind"]), SCALES.index(g["scale"]))
            groups[key] = float(g[field])
    return default, families, groups


def band_table() -> tuple[float, dict[str, float], dict[tuple[str, int, int], float]]:
    """(default, band per family, band per (family, kind, scale)) from error_bands.yaml."""
    return _table("band")


def _cells(field: str, fam: str) -> np.ndarray:
    """One field of a runtime family as a (kind x scale) table: the family's own group where it
    has one, else the family's value; a MoE cell without a MoE group of the family the widest
    MoE band's group (a MoE plan is never given a dense band: every family's MoE residuals are
    MoE evidence), else the stated default."""
    default, families, groups = _table(field)
    band_groups = _table("band")[2]
    cells = np.full((len(KINDS), len(SCALES)), families.get(fam, default), dtype=float)
    moe_keys = [k for k in band_groups if k[1] == KINDS.index("moe")]
    widest = max(moe_keys, key=band_groups.__getitem__, default=None)
    cells[KINDS.index("moe")] = default if widest is None else groups.get(widest, default)
    for (g_fam, g_kind, g_scale), value in groups.items():
        if g_fam == fam:
            cells[g_kind, g_scale] = value
    return cells


def fp8_band_and_bias(runtime: str, moe: bool) -> tuple[float, float]:
    """(band, bias) of an fp8 plan: its runtime family's fp8 runs of its class (dense or MoE)
    where at least MIN_RUNS, else the widest such group of its class in any family (an fp8
    plan never takes a 16-bit band: NVIDIA's Llama 3.1 70B layout missed by 19% in fp8 and 7%
    in bf16), else the stated default and no bias."""
    data = _bands()
    cls = "moe" if moe else "dense"
    groups = [g for g in data.get("fp8") or [] if g.get("class") == cls
              and g.get("runs", 0) >= MIN_RUNS and g.get("band") is not None]
    own = next((g for g in groups if g["family"] == family(runtime)), None)
    chosen = own or max(groups, key=lambda g: float(g["band"]), default=None)
    if chosen is None:
        return float(data.get("default", 0.25)), 0.0
    return float(chosen["band"]), float(chosen.get("bias") or 0.0)


def band_and_bias_of_table(runtime: str, r: Rows, profile: ClusterProfile, moe: bool = False,
                           precision: str = "bf16") -> tuple[np.ndarray, np.ndarray]:
    """Every row's relative step-time error band and the bias of the runs behind it (how much
    longer than priced they took, on average: mean measured / predicted - 1; 0 where no group
    or family has runs), by the row's kind and scale (`moe`: the model has experts); an fp8
    table's from the fp8 runs (fp8_band_and_bias)."""
    fam = family(runtime)
    shape = np.shape(r.world)
    if precision_class(precision) == "fp8":
        band, bias = fp8_band_and_bias(runtime, moe)
        return np.full(shape, band), np.full(shape, bias)
    kind = np.broadcast_to(kind_of(r.tp, r.pp, r.cp, moe), shape)
    scale = np.broadcast_to(scale_of(r.world, profile.gpus_per_node), shape)
    return _cells("band", fam)[kind, scale], _cells("bias", fam)[kind, scale]


SIXTEEN_BIT = ("bf16", "fp16")
"""The precisions of every scored published run: bands by kind and scale are theirs."""


def precision_class(precision: str) -> str | None:
    """"16-bit" (bf16, fp16), "fp8", or None (fp32: no validated run trained in it). An fp8
    plan's MFU counts against the fp8 peak and its kernels are other ones (scaled GEMMs, casts):
    it takes the fp8 runs' band and ceilings, not the 16-bit runs'."""
    return "16-bit" if precision in SIXTEEN_BIT else "fp8" if precision == "fp8" else None
LONG_CONTEXT = 32768
"""Sequence length from which a run or plan is of the long-context class: MFU counts attention's
FLOPs, which grow with the sequence (the Model Zoo's Qwen3 at 128K made 72% where its 4K-16K
runs made under 50%), so long runs set no ceiling for short plans, nor the reverse."""


def context_class(seq_len: int) -> str:
    return "long" if seq_len >= LONG_CONTEXT else "short"


def device_class(name: str) -> str | None:
    """The GPU model a device name names ("A100" in "A100-SXM4-80GB" and in torch's "NVIDIA
    A100-SXM4-80GB"; "H100" in "NVIDIA H100 80GB HBM3"): the first word-initial token of one or
    two capitals and three digits (an optional trailing capital: "MI300X"), or None (a CPU).
    Runs on one model of GPU share its tensor-core peak, against which MFU is counted; memory
    size, bandwidth and form factor (A100 40GB or 80GB, H100 SXM or PCIe) are not told apart."""
    m = re.search(r"(?<![A-Za-z0-9])([A-Z]{1,2}\d{3}[A-Z]?)(?![a-z0-9])", name)
    return m.group(1) if m else None


@dataclass(frozen=True)
class MfuCeiling:
    """The validated runs of one runtime family on one GPU model, of one kind of parallelism
    (KINDS, or DENSE: every dense kind) and one context class: the highest MFU the cost model
    predicts for any of them (the run, and the MFU it measured: predicted MFU x predicted /
    measured step, the cost model's own FLOP count), from published_accuracy --write-bands.
    A plan predicted above it lies outside the range the validation covers: the model
    extrapolates there."""

    family: str
    device: str
    kind: str
    context: str
    precision: str
    """precision_class: "16-bit" or "fp8"."""
    mfu: float
    """The highest predicted MFU among the runs."""
    run: str
    """The run predicted at it."""
    measured: float
    """That run's MFU as measured."""
    runs: int
    """Validated runs behind it."""

    def describe(self) -> str:
        """"the 22 validated megatron runs of pipeline layouts on A100 (highest predicted
        58.1%: korthikanti-530b-sp-selective, measured 56.0%)"; for ANY_FAMILY, "the 31
        validated runs (any runtime) of ..."."""
        long = " at 32K+ tokens" if self.context == "long" else ""
        fp8 = " in fp8" if self.precision == "fp8" else ""
        who = ("runs (any runtime)" if self.family == ANY_FAMILY
               else f"{self.family} runs")
        return (f"the {self.runs} validated {who} of {KIND_WORDS[self.kind]}{long} "
                f"on {self.device}{fp8} (highest predicted {self.mfu:.1%}: {self.run}, measured "
                f"{self.measured:.1%})")


ANY_FAMILY = "any"
"""The ceiling key of every runtime family together, per kind: a plan's fallback where its own
family has too few validated runs of its kind on its GPU. Issue #11 asks that a plan predicted
high be explained by a published run of its kind: a pipeline layout by pipeline runs, whoever
ran them, before data-parallel runs of its own runtime."""
DENSE = "dense"
"""The ceiling key of every dense kind together: a dense plan's fallback where its own kind has
too few validated runs on its GPU (a MoE plan has none: a MoE layer's grouped GEMMs and
all-to-all say nothing of a dense layout's MFU, and the reverse)."""
KIND_WORDS = {"dp": "data-parallel layouts", "tp": "tensor/context-parallel layouts",
              "3d": "pipeline layouts", "moe": "mixture-of-experts models",
              DENSE: "dense models"}


@functools.cache
def _ceilings() -> dict[tuple[str, str, str, str, str], MfuCeiling]:
    out = {}
    for c in _bands().get("mfu_ceilings") or []:
        if c.get("runs", 0) < MIN_RUNS:  # one or two runs are no validated range
            continue
        ceiling = MfuCeiling(str(c["family"]), str(c["device"]), str(c["kind"]),
                             str(c["context"]), str(c["precision"]), float(c["mfu"]),
                             str(c["run"]), float(c["measured"]), int(c["runs"]))
        key = (ceiling.family, ceiling.device, ceiling.kind, ceiling.context, ceiling.precision)
        out[key] = ceiling
    return out


def mfu_ceiling(runtime: str, kind: int, profile: ClusterProfile, precision: str,
                seq_len: int) -> MfuCeiling | None:
    """The validated range a plan of this runtime, kind (an index into KINDS), precision and
    sequence length on this profile's GPU is held against: its runtime family's runs of its
    kind, context and precision class on its GPU model; else every family's runs of that kind
    (ANY_FAMILY); else (a dense plan) its family's runs of any dense kind; each from at least
    MIN_RUNS runs; None for a GPU model without them, a CPU, or fp32. Nothing caps a
    prediction with it: a plan above it is one the validation does not reach, which estimate
    and search say."""
    device, prec = device_class(profile.device.name), precision_class(precision)
    if device is None or prec is None or profile.is_cpu:
        return None
    table, fam, ctx = _ceilings(), family(runtime), context_class(seq_len)
    for key in ((fam, KINDS[kind]), (ANY_FAMILY, KINDS[kind]), (fam, DENSE)):
        if key[1] == DENSE and KINDS[kind] == "moe":
            break  # a MoE plan is never held against dense runs
        found = table.get((key[0], device, key[1], ctx, prec))
        if found is not None:
            return found
    return None


def mfu_ceiling_array(runtime: str, tp: Any, pp: Any, cp: Any, profile: ClusterProfile,
                      precision: str, moe: bool, seq_len: int) -> np.ndarray:
    """Every row's ceiling MFU (mfu_ceiling; NaN where none applies)."""
    kind = np.broadcast_to(kind_of(tp, pp, cp, moe), np.broadcast(tp, pp, cp).shape)
    values = np.full(len(KINDS), np.nan)
    for k in range(len(KINDS)):
        c = mfu_ceiling(runtime, k, profile, precision, seq_len)
        values[k] = np.nan if c is None else c.mfu
    return values[kind]


def above_ceiling(mfu: Any, ceiling: Any) -> Any:
    """Whether each MFU lies above its ceiling by more than half the 0.1% it is printed to (a
    plan printed at the ceiling's own figure is not above it; NaN ceiling: never)."""
    ceiling = np.asarray(ceiling, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(ceiling), False, np.asarray(mfu) > ceiling + 0.0005)
