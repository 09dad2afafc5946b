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


def band_and_bias_of_table(runtime: str, r: Rows, profile: ClusterProfile, moe: bool = False
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Every row's relative step-time error band and the bias of the runs behind it (how much
    longer than priced they took, on average: mean measured / predicted - 1; 0 where no group
    or family has runs), by the row's kind and scale (`moe`: the model has experts)."""
    fam = family(runtime)
    shape = np.shape(r.world)
    kind = np.broadcast_to(kind_of(r.tp, r.pp, r.cp, moe), shape)
    scale = np.broadcast_to(scale_of(r.world, profile.gpus_per_node), shape)
    return _cells("band", fam)[kind, scale], _cells("bias", fam)[kind, scale]
