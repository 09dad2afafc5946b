"""Runtime traits: strict loading, presets, and that the same plan is priced per runtime."""

from __future__ import annotations

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import RUNTIMES, load_runtime
from autoplan.errors import ConfigError
from autoplan.plan import plan_from_dict

LLAMA8B = {"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
           "parallel": {"dp": 8}, "zero_stage": 1,
           "batch": {"micro_batch_size": 1, "global_batch_size": 64}}


def test_every_preset_loads_and_names_itself() -> None:
    for name in RUNTIMES:
        assert load_runtime(name).name == name
    assert load_runtime(None).name == "autoplan-cuda"
    assert load_runtime("autoplan", on_cpu=True).name == "autoplan-cpu"


def test_a_traits_file_is_loaded_strictly(tmp_path) -> None:
    good = tmp_path / "mine.yaml"
    good.write_text("schema_version: 1\nname: mine\nfused_swiglu: false\ntp_comm_overlap: 0.5\n")
    traits = load_runtime(str(good))
    assert traits.name == "mine" and not traits.fused_swiglu and traits.tp_comm_overlap == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: bad\nfused_swiglue: false\n")
    with pytest.raises(ConfigError, match="fused_swiglue"):
        load_runtime(str(bad))
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        good.write_text("schema_version: 1\nname: x\ntp_comm_overlap: 2\n")
        load_runtime(str(good))
    with pytest.raises(ConfigError, match="unknown runtime"):
        load_runtime("megatorn")


def test_the_same_plan_costs_what_each_runtime_keeps() -> None:
    plan = plan_from_dict(LLAMA8B)
    megatron = estimate_plan(plan, runtime="megatron")
    titan = estimate_plan(plan, runtime="torchtitan")
    ours = estimate_plan(plan, runtime="autoplan-cuda")
    assert (megatron.runtime, titan.runtime) == ("megatron", "torchtitan")
    # eager SwiGLU keeps silu's output (2sbf per layer more) and torchtitan's composite RMSNorm
    # its fp32 copies (8sbh per norm instead of 2sbh)
    assert ours.memory["activations"] > megatron.memory["activations"]
    assert titan.memory["activations"] > ours.memory["activations"]
    # eager element-wise kernels move more bytes than fused ones
    assert titan.time["compute"] > ours.time["compute"] > megatron.time["compute"]
    # FSDP2's fp32 sharded masters and Adam (4 + 8) against Megatron's 16-bit model + 12
    assert titan.memory["params"] > megatron.memory["params"]
    assert titan.memory["optimizer"] < megatron.memory["optimizer"]


def test_a_runtime_refuses_what_it_cannot_run() -> None:
    plan = plan_from_dict({**LLAMA8B, "zero_stage": 3})
    est = estimate_plan(plan, runtime="megatron")
    assert not est.feasible and any("ZeRO stage 3" in r for r in est.reasons)
    titan = estimate_plan(plan, runtime="torchtitan")
    assert not any("ZeRO" in r for r in titan.reasons)


def test_tp_overlap_hides_tensor_parallel_time() -> None:
    plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 1, "tp": 8}, "sequence_parallel": True,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    plain, nemo = estimate_plan(plan, runtime="megatron"), estimate_plan(plan, runtime="nemo")
    overlap = load_runtime("nemo").tp_comm_overlap
    # the blocks' collectives hide behind their GEMMs; the embedding's, the loss's and the
    # norm-gradient sums do not
    assert plain.time["tp_comm"] * (1 - overlap) < nemo.time["tp_comm"] < 0.5 * plain.time["tp_comm"]
    assert nemo.time["compute"] == pytest.approx(plain.time["compute"])


def test_every_estimate_carries_a_band() -> None:
    est = estimate_plan(plan_from_dict(LLAMA8B), runtime="megatron")
    assert 0 < est.error_band < 1
