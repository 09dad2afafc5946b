"""The validated runs' highest MFU per runtime family, GPU model and kind (error_band.mfu_ceiling):
estimate and search say when a plan is predicted above it; nothing caps a prediction with it."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.cost.error_band import (
    DENSE,
    KINDS,
    MIN_RUNS,
    _bands,
    device_class,
    mfu_ceiling,
)
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import load_profile
from autoplan.plan import plan_from_dict

ROOT = Path(__file__).resolve().parents[3]


def _bench():
    path = ROOT / "benchmarks" / "published_accuracy.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("published_accuracy_ceiling", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("name", "cls"), [
    ("A100-SXM4-80GB", "A100"), ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("H100-SXM5-96GB", "H100"), ("H200-SXM-141GB", "H200"),
    ("V100-SXM2-32GB", "V100"), ("AMD Instinct MI300X", "MI300X"), ("cpu-1-thread", None),
])
def test_device_class_names_the_gpu_model_whatever_the_form_factor(name, cls) -> None:
    assert device_class(name) == cls


def test_ceilings_are_measured_mfu_per_family_device_and_kind() -> None:
    """Measured MFU is the predicted one scaled by predicted / measured step time; a dense run
    counts toward its kind and toward every dense kind together, a MoE run toward MoE only,
    and a run in fp8 or on a CPU toward none."""
    rows = [
        {"id": "a", "runtime": "megatron", "device": "A100-SXM4-80GB", "precision": "bf16",
         "kind": "3d", "mfu": 0.50, "error": 0.10},   # predicted 10% slow: measured 0.55
        {"id": "b", "runtime": "nemo", "device": "NVIDIA A100-SXM4-80GB", "precision": "fp16",
         "kind": "tp", "mfu": 0.60, "error": -0.10},  # measured 0.54
        {"id": "c", "runtime": "megatron", "device": "A100-SXM4-80GB", "precision": "bf16",
         "kind": "moe", "mfu": 0.70, "error": 0.0},
        {"id": "d", "runtime": "megatron", "device": "A100-SXM4-80GB", "precision": "fp8",
         "kind": "3d", "mfu": 0.90, "error": 0.0},
        {"id": "e", "runtime": "megatron", "device": "cpu-1-thread", "precision": "bf16",
         "kind": "3d", "mfu": 0.90, "error": 0.0},
    ]
    got = {(c["family"], c["device"], c["kind"]): (c["mfu"], c["run"], c["runs"])
           for c in _bench().mfu_ceilings(rows)}
    assert got == {("megatron", "A100", "3d"): (0.55, "a", 1),
                   ("megatron", "A100", "tp"): (0.54, "b", 1),
                   ("megatron", "A100", DENSE): (0.55, "a", 2),
                   ("megatron", "A100", "moe"): (0.7, "c", 1)}


def test_shipped_ceilings_hold_together() -> None:
    """Every dense kind's ceiling is at most its family's dense one on that GPU, with no more
    runs behind it, and each names a run and an MFU below 1."""
    entries = _bands()["mfu_ceilings"]
    dense = {(c["family"], c["device"]): c for c in entries if c["kind"] == DENSE}
    assert ("megatron", "A100") in dense and ("torchtitan", "H100") in dense
    for c in entries:
        assert 0 < c["mfu"] < 1 and c["run"] and c["runs"] >= 1
        if c["kind"] not in (DENSE, "moe"):
            whole = dense[(c["family"], c["device"])]
            assert c["mfu"] <= whole["mfu"] and c["runs"] <= whole["runs"]


def _gpt3(parallel: dict, **plan) -> dict:
    return {"model": "gpt3-175b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 1024},
            "parallel": parallel, "sequence_parallel": True, "zero_stage": 1, **plan}


def test_gpt3_winner_is_above_the_validated_megatron_runs_and_the_recipe_is_not() -> None:
    """GPT-3 175B on 1,024 A100s priced for Megatron: search's winner (tp4 pp8 v12, no
    recompute) is predicted at ~64% MFU, above every validated Megatron pipeline run on A100
    (Korthikanti et al.'s 1T at 56.3%); NeMo's published layout (tp8 pp16 v6, selective) is
    not."""
    winner = plan_from_dict(_gpt3({"dp": 32, "tp": 4, "pp": 8},
                                  pipeline={"schedule": "interleaved-1f1b", "vpp": 12},
                                  batch={"micro_batch_size": 2, "global_batch_size": 1536}))
    recipe = plan_from_dict(_gpt3({"dp": 8, "tp": 8, "pp": 16},
                                  pipeline={"schedule": "interleaved-1f1b", "vpp": 6},
                                  recompute={"policy": "selective"},
                                  batch={"micro_batch_size": 1, "global_batch_size": 1536}))
    est = estimate_plan(winner, runtime="megatron")
    ceiling = est.mfu_ceiling
    assert ceiling is not None and (ceiling.family, ceiling.device, ceiling.kind) == (
        "megatron", "A100", "3d")
    shipped = next(c for c in _bands()["mfu_ceilings"]
                   if (c["family"], c["device"], c["kind"]) == ("megatron", "A100", "3d"))
    assert (ceiling.mfu, ceiling.run, ceiling.runs) == (shipped["mfu"], shipped["run"],
                                                       shipped["runs"])
    assert est.mfu > ceiling.mfu and est.above_validated
    base = estimate_plan(recipe, runtime="megatron")
    assert base.mfu_ceiling == ceiling and base.mfu < ceiling.mfu and not base.above_validated


def test_no_ceiling_without_enough_validated_runs_of_that_precision_or_gpu() -> None:
    h100, a100 = load_profile("h100-sxm-80gb"), load_profile("a100-sxm4-80gb")
    assert mfu_ceiling("megatron", KINDS.index("3d"), h100, "fp8") is None
    assert mfu_ceiling("megatron", KINDS.index("3d"), load_profile("cpu-gloo"), "bf16") is None
    assert mfu_ceiling("megatron", KINDS.index("3d"), load_profile("h200-sxm-141gb"),
                       "bf16") is None
    # a kind with fewer than MIN_RUNS runs of its own takes the family's dense ceiling there
    few = [c for c in _bands()["mfu_ceilings"] if (c["family"], c["device"], c["kind"]) ==
           ("megatron", "A100", "dp")]
    assert few and few[0]["runs"] < MIN_RUNS
    got = mfu_ceiling("megatron", KINDS.index("dp"), a100, "bf16")
    assert got is not None and got.kind == DENSE
    # a MoE plan is never held against dense runs, nor a dense plan against MoE runs
    moe = mfu_ceiling("megatron", KINDS.index("moe"), h100, "bf16")
    dense = mfu_ceiling("megatron", KINDS.index("dp"), h100, "bf16")
    assert moe is not None and moe.kind == "moe" and dense is not None and dense.kind == DENSE
    assert mfu_ceiling("megatron", KINDS.index("moe"), a100, "bf16") is None  # no A100 MoE runs


def test_estimate_says_so_in_its_table_and_json(capsys) -> None:
    argv = ["estimate", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus",
            "1024", "--runtime", "megatron", "--global-batch-size", "1536",
            "--micro-batch-size", "2", "--set", "parallel.dp=32", "parallel.tp=4", "parallel.pp=8",
            "sequence_parallel=true", "pipeline.schedule=interleaved-1f1b", "pipeline.vpp=12",
            "zero_stage=1"]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["above_validated"] is True
    assert data["mfu_ceiling"]["kind"] == "3d" and data["mfu"] > data["mfu_ceiling"]["mfu"]
    assert main([*argv, "--format", "table"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (f"unvalidated: MFU {data['mfu']:.1%} is above all validated megatron runs of "
            f"pipeline layouts on A100 ({data['mfu_ceiling']['runs']}: highest measured "
            f"{data['mfu_ceiling']['mfu']:.1%}, {data['mfu_ceiling']['run']})") in text
    # below the ceiling: the key says so and the table prints no such line
    small = ["estimate", "--model", "gpt3-1.3b", "--cluster", "a100-sxm4-80gb", "--num-gpus",
             "8", "--runtime", "megatron", "--format", "json"]
    assert main(small) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["above_validated"] is False and not math.isnan(data["mfu"])
