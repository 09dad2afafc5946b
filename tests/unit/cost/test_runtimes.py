"""Runtime traits: strict loading, presets, and that the same plan is priced per runtime."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import RUNTIMES, load_runtime, runtime_from_dict
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
    for bad in (-100, 1e300, float("nan")):  # priced an optimizer step of negative seconds
        with pytest.raises(ConfigError, match="optimizer_extra_bytes"):
            runtime_from_dict({"name": "x", "optimizer_extra_bytes": bad})


def test_a_traits_file_may_start_from_a_preset(tmp_path) -> None:
    """`base: <preset>` takes the preset's fields; the file's own override them."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("schema_version: 1\nname: nemo-perf\nbase: nemo\nfused_swiglu: false\n")
    traits, nemo = load_runtime(str(mine)), load_runtime("nemo")
    assert traits.name == "nemo-perf" and not traits.fused_swiglu and nemo.fused_swiglu
    assert traits.tp_comm_overlap_method == nemo.tp_comm_overlap_method == "userbuffers"
    mine.write_text("schema_version: 1\nbase: nemo-perf\n")
    with pytest.raises(ConfigError, match="base.*unknown preset"):
        load_runtime(str(mine))


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
    est = estimate_plan(plan, runtime="megatron-2022")
    assert not est.feasible and any("ZeRO stage 3" in r for r in est.reasons)
    # today's Megatron runs ZeRO-3 as Megatron-FSDP, without a pipeline only
    assert estimate_plan(plan, runtime="megatron").feasible
    piped = plan_from_dict({**LLAMA8B, "zero_stage": 3, "parallel": {"dp": 4, "pp": 2}})
    assert any("with a pipeline" in r for r in estimate_plan(piped, runtime="megatron").reasons)
    titan = estimate_plan(plan, runtime="torchtitan")
    assert not any("ZeRO" in r for r in titan.reasons)


def test_tp_overlap_hides_tensor_parallel_time() -> None:
    plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 1, "tp": 8}, "sequence_parallel": True,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    plain, nemo = estimate_plan(plan, runtime="megatron"), estimate_plan(plan, runtime="nemo")
    exposed = float(load_runtime("nemo").tp_exposed_share(np.array(8.0), np.array(True)))
    # Transformer Engine's defaults at tp 8: 4 ring exchanges leave 1/8 each, 2 pipelined
    # reduce-scatters 1/4 each, 4 bulk overlaps nothing: 1 collective's time, of the 8 equal
    # ones the block's sequence-parallel total prices (the 2 re-gathers are bulk, unpriced)
    assert exposed == pytest.approx((4 / 8 + 2 / 4) / 8)
    # the blocks' collectives hide behind their GEMMs; the embedding's, the loss's and the
    # norm-gradient sums do not
    assert plain.time["tp_comm"] * exposed < nemo.time["tp_comm"] < 0.5 * plain.time["tp_comm"]
    # the pipelined reduce-scatters keep SMs from two forward GEMMs (userbuffers_*_sms); with
    # none kept, compute is Megatron's
    no_margin = replace(load_runtime("nemo"), userbuffers_proj_sms=0,
                        userbuffers_fc2_sms=0)
    assert estimate_plan(plan, runtime=no_margin).time["compute"] == pytest.approx(
        plain.time["compute"])
    assert nemo.time["compute"] > plain.time["compute"]


def test_userbuffers_overlap_needs_sequence_parallelism() -> None:
    plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 1, "tp": 8}, "sequence_parallel": False,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    plain, nemo = estimate_plan(plan, runtime="megatron"), estimate_plan(plan, runtime="nemo")
    assert nemo.time["tp_comm"] == pytest.approx(plain.time["tp_comm"])


def test_overlap_never_hides_more_than_the_gemms_beside_it() -> None:
    # tp 16 spans two A100 nodes: the collectives over InfiniBand outlast the block's GEMMs
    plan = plan_from_dict({**LLAMA8B, "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 16},
                           "parallel": {"dp": 1, "tp": 16}, "sequence_parallel": True,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    plain, nemo = estimate_plan(plan, runtime="megatron"), estimate_plan(plan, runtime="nemo")
    hidden = plain.time["tp_comm"] - nemo.time["tp_comm"]
    gemm_time = nemo.time["compute"]  # GEMMs are part of it: an upper bound on what can hide
    assert 0 < hidden < gemm_time
    exposed = float(load_runtime("nemo").tp_exposed_share(np.array(16.0), np.array(True)))
    assert nemo.time["tp_comm"] > plain.time["tp_comm"] * exposed


def test_every_estimate_carries_a_band() -> None:
    est = estimate_plan(plan_from_dict(LLAMA8B), runtime="megatron")
    assert 0 < est.error_band < 1


def test_a_runtime_refuses_offload_it_cannot_run() -> None:
    # FSDP2 offloads parameters, gradients and optimizer states together; Megatron-Core the
    # distributed optimizer only
    plan = plan_from_dict({**LLAMA8B, "zero_stage": 3, "offload": {"params": True}})
    titan = estimate_plan(plan, runtime="torchtitan")
    assert not titan.feasible
    assert any("cannot offload the parameters alone" in r for r in titan.reasons)
    both = plan_from_dict({**LLAMA8B, "zero_stage": 3,
                           "offload": {"params": True, "optimizer": True}})
    assert not any("offload" in r for r in estimate_plan(both, runtime="torchtitan").reasons)
    opt = plan_from_dict({**LLAMA8B, "zero_stage": 1, "offload": {"optimizer": True}})
    assert not any("offload" in r for r in estimate_plan(opt, runtime="megatron").reasons)
    assert any("cannot offload the optimizer alone" in r
               for r in estimate_plan(opt, runtime="megatron-2022").reasons)


def test_megatron_offloads_the_optimizer_at_zero_1_only_as_its_export_says() -> None:
    # --optimizer-cpu-offload is the distributed optimizer's: the search under Megatron's traits
    # must refuse what `export --to megatron` refuses (a ZeRO-2 offload winner was exported as
    # "cannot express this plan" before the rule was shared)
    from autoplan.export.megatron import _reasons

    for stage in (1, 2, 3):
        plan = plan_from_dict({**LLAMA8B, "zero_stage": stage, "offload": {"optimizer": True}})
        exported = [r for r in _reasons(plan, plan.model_spec()) if r.startswith("offload")]
        for runtime in ("megatron", "megatron-deepep", "nemo"):
            priced = [r for r in estimate_plan(plan, runtime=runtime).reasons if "offload" in r]
            assert bool(priced) == bool(exported) == (stage != 1), (runtime, stage, priced)
            if priced:
                assert f"got zero_stage {stage}; set zero_stage 1" in priced[0]
        assert not any("offload" in r for r in estimate_plan(plan, runtime="deepspeed").reasons)


def test_offload_zero_stages_are_checked() -> None:
    with pytest.raises(ConfigError, match="runtime.offload_zero_stages"):
        runtime_from_dict({"schema_version": 1, "base": "megatron", "offload_zero_stages": [0]})


def test_fsdp2_offload_keeps_what_the_runtime_keeps_on_the_device() -> None:
    # autoplan's optimizer-only offload steps on host copies of the FSDP2 shards: the fp32
    # gradient shard stays on the device; DeepSpeed's ZeRO-Offload streams it to the host
    plan = plan_from_dict({**LLAMA8B, "zero_stage": 2, "offload": {"optimizer": True}})
    ours, ds = estimate_plan(plan, runtime="autoplan-cuda"), estimate_plan(plan, runtime="deepspeed")
    shard = ours.num_params / 8
    assert ours.memory["grads"] == pytest.approx(4.0 * shard, rel=0.02)
    assert ds.memory["grads"] == 0.0
    # FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer state, and steps on
    # the host: nothing of them on the device, 16 bytes per parameter on the host, and the
    # host step priced even without the optimizer flag
    params_only = plan_from_dict({**LLAMA8B, "zero_stage": 3, "offload": {"params": True}})
    est = estimate_plan(params_only, runtime="autoplan-cuda")
    assert est.memory["grads"] == est.memory["optimizer"] == est.memory["params"] == 0.0
    assert est.memory["host_total"] == pytest.approx(16.0 * shard, rel=0.02)
    assert est.time["optimizer"] == 0.0 and est.time["offload"] > 0.0
    ds_params = estimate_plan(params_only, runtime="deepspeed")
    assert ds_params.memory["optimizer"] > 0.0  # ZeRO-Infinity's parameter offload alone


def test_megatron_selective_recompute_sends_nothing_again() -> None:
    # Megatron checkpoints the attention core on the Q, K, V it kept (no collective inside);
    # autoplan's runtime re-runs the norms and re-gathers their sequence-parallel outputs
    sel = {**LLAMA8B, "parallel": {"dp": 1, "tp": 8}, "sequence_parallel": True,
           "batch": {"micro_batch_size": 1, "global_batch_size": 8}}
    none = plan_from_dict(sel)
    selective = plan_from_dict({**sel, "recompute": {"policy": "selective"}})
    meg = [estimate_plan(p, runtime="megatron").time["tp_comm"] for p in (none, selective)]
    ours = [estimate_plan(p, runtime="autoplan-cuda").time["tp_comm"] for p in (none, selective)]
    assert meg[1] == pytest.approx(meg[0])
    assert ours[1] > ours[0] * 1.2


def test_torchtitan_recomputes_every_block_none_or_every_nth() -> None:
    # 5 of Llama-3 8B's 32 layers: Megatron's --recompute-num-layers 5; torchtitan cannot
    some = plan_from_dict({**LLAMA8B, "zero_stage": 3,
                           "recompute": {"policy": "full", "num_layers": 5}})
    assert any("every n-th block" in r for r in estimate_plan(some, runtime="torchtitan").reasons)
    assert not estimate_plan(some, runtime="megatron").reasons
    # 16 of 32 is every 2nd block (selective_ac_option = 2), without a pipeline only
    half = plan_from_dict({**LLAMA8B, "zero_stage": 3,
                           "recompute": {"policy": "full", "num_layers": 16}})
    assert not estimate_plan(half, runtime="torchtitan").reasons
    piped = plan_from_dict({**LLAMA8B, "zero_stage": 3, "parallel": {"dp": 4, "pp": 2},
                            "recompute": {"policy": "full", "num_layers": 8}})
    assert any("every n-th block" in r for r in estimate_plan(piped, runtime="torchtitan").reasons)
    every = plan_from_dict({**LLAMA8B, "zero_stage": 3, "recompute": {"policy": "full"}})
    assert not estimate_plan(every, runtime="torchtitan").reasons
    # selective_ac_option = n checkpoints whole blocks fully: selective or uniform is not it
    for rc in ({"policy": "selective", "num_layers": 16},
               {"policy": "full", "num_layers": 16, "method": "uniform"}):
        odd = plan_from_dict({**LLAMA8B, "zero_stage": 3, "recompute": rc})
        assert any("every n-th block" in r for r in estimate_plan(odd, runtime="torchtitan").reasons)


def test_sms_kept_for_communication_slow_the_compute_and_need_an_sm_count(tmp_path) -> None:
    plan = plan_from_dict(LLAMA8B)
    base = load_runtime("megatron")
    full = estimate_plan(plan, runtime=base)
    kept = estimate_plan(plan, runtime=replace(base, comm_reserved_sms=33))  # a quarter of 132
    assert full.time["compute"] < kept.time["compute"] <= full.time["compute"] * 132 / 99
    assert kept.mfu < full.mfu  # the peak MFU is measured against stays the datasheet's
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: bad\ncomm_reserved_sms: -1\n")
    with pytest.raises(ConfigError, match="comm_reserved_sms"):
        load_runtime(str(bad))
    cpu = plan_from_dict({**LLAMA8B, "model": "tiny", "cluster": {"profile": "cpu-gloo",
                                                                  "num_gpus": 2},
                          "parallel": {"dp": 2}, "batch": {"micro_batch_size": 1,
                                                           "global_batch_size": 4}})
    with pytest.raises(ConfigError, match="sm_count"):
        estimate_plan(cpu, runtime=replace(load_runtime("autoplan", on_cpu=True),
                                           comm_reserved_sms=4))


def test_autoplan_runtime_refuses_what_autoplan_train_refuses() -> None:
    """One rule set: the limits only autoplan's runtime has (plan_rules.RUNTIME_RULES) mask the
    search and name the refusal in estimate for autoplan-cuda, and not for Megatron-LM."""
    from autoplan.cost import runtime_rules
    from autoplan.plan_rules import runtime_limits
    from autoplan.plan_table import plan_to_row

    plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 4, "tp": 2}, "sequence_parallel": True,
                           "recompute": {"policy": "selective", "modules": ["layernorm"]}})
    model = plan.model_spec()
    assert runtime_limits(plan, model)  # autoplan train refuses it
    row = plan_to_row(plan, model)
    for name, refused in (("autoplan", True), ("megatron", False)):
        traits = load_runtime(name)
        assert bool(runtime_rules.lacking(row, traits, model)[0]) is refused
        said = runtime_rules.refusals(plan, traits, model)
        assert any("layernorm" in line for line in said) is refused


def test_autoplan_runtime_refuses_fp8_with_tp_as_autoplan_train_does() -> None:
    """autoplan train runs fp8 through torchao without its TP styles (runtime/float8.py): the
    rule runtime-fp8-tp masks such plans for autoplan-cuda, not for Megatron-LM or torchtitan."""
    from autoplan.cost import runtime_rules
    from autoplan.plan_table import plan_to_row

    for tp, refused in ((2, True), (1, False)):
        plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 8 // tp, "tp": tp},
                               "sequence_parallel": tp > 1,  # torchtitan 0.2 shards norms
                               "zero_stage": 2, "precision": "fp8"})  # a stage all three run
        model = plan.model_spec()
        row = plan_to_row(plan, model)
        for name in ("autoplan", "megatron", "torchtitan"):
            said = runtime_rules.refusals(plan, load_runtime(name), model)
            assert bool(runtime_rules.lacking(row, load_runtime(name), model)[0]) is (
                refused and name == "autoplan")
            assert any("fp8 with tp=2" in line for line in said) is (refused and name == "autoplan")


@pytest.mark.parametrize(("vpp", "refused"), [(1, True), (2, False)])
def test_torchtitan_runs_zero_bubble_only_with_several_stages_per_rank(vpp, refused) -> None:
    """torchtitan's zero-bubble schedules (InterleavedZeroBubble, ZBVZeroBubble) are multi-stage:
    a one-stage ZB plan is refused for it (its exporter refuses the same), not for autoplan."""
    from autoplan.cost import runtime_rules

    plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 4, "pp": 2}, "zero_stage": 2,
                           "pipeline": {"schedule": "zero-bubble", "vpp": vpp}})
    said = runtime_rules.refusals(plan, load_runtime("torchtitan"), plan.model_spec())
    assert any("only with several stages per rank" in line for line in said) is refused
    assert not any("several stages" in line for line in runtime_rules.refusals(
        plan, load_runtime("autoplan"), plan.model_spec()))
    with pytest.raises(ConfigError, match="multi_stage_schedules"):
        from autoplan.cost.runtimes import runtime_from_dict
        runtime_from_dict({"schema_version": 1, "name": "x", "schedules": ["1f1b"],
                           "multi_stage_schedules": ["zero-bubble"]})


def test_offloaded_gradients_cross_pcie_in_the_dtype_the_host_steps_on() -> None:
    from autoplan.cost.offload import HOST_GRAD_BYTES, optimizer_offload_time_s
    from autoplan.hardware import load_profile

    # DeepSpeed keeps 16-bit gradient partitions on the device but copies fp32 master
    # gradients; so do the others (module docstring of HOST_GRAD_BYTES)
    assert load_runtime("deepspeed").grad_bytes("bf16") == 2.0
    assert HOST_GRAD_BYTES == 4.0
    profile = load_profile("h100-sxm-80gb")
    shard, pcie = 1e9, profile.host.pcie_bytes_per_s
    cpu = shard / profile.host.optimizer_params_per_s
    exposed = optimizer_offload_time_s(np.array(shard), np.array(1), 2.0, 4.0, profile,
                                       np.array(0.0))
    assert exposed == pytest.approx(cpu + shard * 2.0 / pcie + shard * 4.0 / pcie)
    hidden = optimizer_offload_time_s(np.array(shard), np.array(1), 2.0, 4.0, profile,
                                      np.array(10.0))  # a backward long enough to hide it
    assert hidden == pytest.approx(cpu + shard * 2.0 / pcie)


def test_autoplans_host_optimizer_moves_fp32_shards_after_backward() -> None:
    """autoplan's HostOffloadOptimizer copies the fp32 gradient shards to the host in step(),
    after backward, waits for them, steps, and copies the fp32 masters back into FSDP2's fp32
    shards (runtime/offload.py): CPU Adam + 4 + 4 bytes per parameter over PCIe, none hidden.
    FSDP2's CPUOffloadPolicy steps the host copies it streams in: no copy back."""
    from autoplan.cost.params import total_params
    from autoplan.hardware import load_profile

    h100 = load_profile("h100-sxm-80gb")
    base = {**LLAMA8B, "zero_stage": 3, "offload": {"optimizer": True}}
    plan = plan_from_dict(base)
    shard, pcie = total_params(plan.model_spec()) / 8, h100.host.pcie_bytes_per_s
    cpu = shard / (h100.host.optimizer_params_per_s / 8)
    est = estimate_plan(plan, runtime="autoplan-cuda")
    assert est.time["offload"] == pytest.approx(cpu + 8.0 * shard / pcie, rel=1e-6)
    both = estimate_plan(plan_from_dict({**base, "offload": {"optimizer": True, "params": True}}),
                         runtime="autoplan-cuda")
    streamed = both.time["offload"] - cpu  # the parameter streaming less its hidden share
    assert streamed < est.time["offload"] - cpu  # ... and no copy back


def _with_host_costs(profile_name: str, op_s: float, unit_s: float = 0.0):
    import dataclasses

    from autoplan.hardware import load_profile

    p = load_profile(profile_name)
    return dataclasses.replace(p, efficiency=dataclasses.replace(
        p.efficiency, op_overhead_s=op_s, fsdp_unit_overhead_s=unit_s))


def test_a_host_that_runs_ahead_costs_only_what_the_kernels_do_not_cover() -> None:
    """layer_times_s: device + host seconds on a CPU, max(device, host) where the host issues
    ahead of an asynchronous GPU (autoplan-cuda)."""
    from autoplan.cost.compute import block_ops, layer_times_s
    from autoplan.model_spec import PRESETS

    model = PRESETS["gpt3-1.3b"]
    one = np.ones(1)
    ops_f, ops_b, _ = block_ops(model, False)  # the fused-attention block timed below

    def times(profile, ahead: bool, b: float):
        return layer_times_s(model, profile, profile.device.peak("bf16"), b * one, one, one,
                             np.zeros(1), np.zeros(1), False, host_runs_ahead=ahead)

    free = _with_host_costs("h100-sxm-80gb", 0.0)
    for op_s, b in ((1e-6, 8.0), (2e-4, 1.0)):  # host well under / well over the kernels
        priced = _with_host_costs("h100-sxm-80gb", op_s)
        device, serial, ahead = times(free, False, b), times(priced, False, b), times(priced, True, b)
        for part, ops in (("forward", ops_f), ("backward", ops_b)):
            assert serial[part] == pytest.approx(device[part] + ops * op_s)
            assert ahead[part] == pytest.approx(np.maximum(device[part], ops * op_s))
    assert ahead["forward"] > device["forward"]  # 2e-4 s/op: the host sets the pace


def test_autoplan_cuda_prices_measured_host_costs_only_where_they_bind() -> None:
    import dataclasses

    from autoplan.hardware import ClusterSpec

    def plan(mbs: int, tp: int = 1):
        return plan_from_dict({
            "model": "gpt3-1.3b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
            "parallel": {"dp": 8 // tp, "tp": tp}, "zero_stage": 3,
            "recompute": {"policy": "full"},
            "batch": {"micro_batch_size": mbs, "global_batch_size": 64}})

    cuda = load_runtime("autoplan-cuda")
    assert cuda.eager_host_overheads and cuda.host_runs_ahead
    serial = dataclasses.replace(cuda, host_runs_ahead=False)  # the same runtime, summed
    free = ClusterSpec(_with_host_costs("h100-sxm-80gb", 0.0), 8)
    priced = ClusterSpec(_with_host_costs("h100-sxm-80gb", 1e-5, 2e-4), 8)
    for mbs, tp in ((1, 1), (8, 1), (1, 2)):
        base = estimate_plan(plan(mbs, tp), free, runtime=cuda).time
        ahead = estimate_plan(plan(mbs, tp), priced, runtime=cuda).time
        summed = estimate_plan(plan(mbs, tp), priced, runtime=serial).time
        # running ahead never costs more than issuing and computing in series, nor less than
        # the kernels alone
        for part in ("compute", "recompute", "dp_comm"):
            assert base[part] - 1e-12 <= ahead[part] <= summed[part] + 1e-12, part
        assert ahead["step"] < summed["step"]
        if mbs == 8:  # 8 x 2,048 tokens cover the host; only the root units' hooks remain
            assert ahead["compute"] == pytest.approx(base["compute"])
        else:  # 2,048 tokens of a 1.3B block run shorter than its ops take to issue
            assert ahead["compute"] > 1.05 * base["compute"]
    # DTensor's host costs (tp 2) go with the block's ops: a separate term only in series
    dtensor = _with_host_costs("h100-sxm-80gb", 1e-5)
    dtensor = dataclasses.replace(dtensor, efficiency=dataclasses.replace(
        dtensor.efficiency, dtensor_op_overhead_s=3e-5))
    with_dt = estimate_plan(plan(1, 2), ClusterSpec(dtensor, 8), runtime=cuda).time
    without = estimate_plan(plan(1, 2), ClusterSpec(_with_host_costs("h100-sxm-80gb", 1e-5), 8),
                            runtime=cuda).time
    assert with_dt["compute"] > without["compute"]


def test_a_reentrant_full_recompute_repeats_every_forward_tp_collective() -> None:
    """Megatron's and DeepSpeed's CheckpointFunction re-run the whole block forward, its two
    all-reduces (two all-gathers + two reduce-scatters with SP) included; torch's non-reentrant
    checkpoint, which autoplan's runtime and torchtitan use, skips the block's last one."""
    import dataclasses

    from autoplan.cost import comm
    from autoplan.hardware import load_profile
    from autoplan.model_spec import PRESETS

    profile = load_profile("a100-sxm4-80gb")
    one, eight, msg = np.ones(1, bool), np.full(1, 8.0), np.full(1, 2.0 * 2048 * 6144)
    for sp in (False, True):
        t = comm.tensor_parallel_time_s(PRESETS["gpt3-13b"], msg, msg, eight, np.full(1, sp),
                                        one, profile)
        ar = comm.collective_time_s(comm.ALL_REDUCE, msg, eight, one, profile)
        ag = comm.collective_time_s(comm.ALL_GATHER, msg, eight, one, profile)
        rs = comm.collective_time_s(comm.REDUCE_SCATTER, msg, eight, one, profile)
        assert t["recompute_reentrant"] == pytest.approx(2.0 * (ag + rs) if sp else 2.0 * ar)
        assert t["recompute_full"] == pytest.approx(2.0 * ag + rs if sp else ar)
    assert all(load_runtime(n).reentrant_recompute
               for n in ("megatron", "megatron-2022", "nemo", "megatron-deepep", "deepspeed"))
    assert not any(load_runtime(n).reentrant_recompute
                   for n in ("torchtitan", "autoplan-cuda", "autoplan-cpu"))

    megatron = load_runtime("megatron")
    plain = dataclasses.replace(megatron, reentrant_recompute=False)
    for policy in ("full", "none"):
        plan = plan_from_dict({"model": "gpt3-13b", "cluster": {"profile": "a100-sxm4-80gb",
                                                               "num_gpus": 8},
                               "parallel": {"tp": 8}, "recompute": {"policy": policy},
                               "batch": {"micro_batch_size": 1, "global_batch_size": 4}})
        again, once = (estimate_plan(plan, runtime=rt).time["tp_comm"] for rt in (megatron, plain))
        assert (again > once) if policy == "full" else (again == once)


def test_megatron_hides_the_input_gradient_collectives_behind_weight_gradients() -> None:
    """Transformer Engine's column-parallel backward launches the dgrad all-reduce (reduce-
    scatter with SP) asynchronously, then computes wgrad: 2 of a block's 4 all-reduces, or 2
    of its 8 SP collectives, hide; the forward ones a recompute repeats do not."""
    import dataclasses

    megatron, tp, no_sp, sp = load_runtime("megatron"), np.full(1, 8.0), np.zeros(1, bool), \
        np.ones(1, bool)
    assert megatron.tp_comm_overlap_method == "async-dgrad"
    assert megatron.tp_exposed_share(tp, no_sp) == pytest.approx(0.5)
    assert megatron.tp_exposed_share(tp, sp) == pytest.approx(0.75)
    assert megatron.tp_recompute_exposed_share(tp, sp) == pytest.approx(1.0)
    nemo = load_runtime("nemo")  # userbuffers: the recomputed forward overlaps like the first
    assert nemo.tp_recompute_exposed_share(tp, sp) == nemo.tp_exposed_share(tp, sp) < 0.75
    plain = dataclasses.replace(megatron, tp_comm_overlap_method="none")
    saved = {}
    for policy in ("none", "full"):
        plan = plan_from_dict({"model": "gpt3-13b", "cluster": {"profile": "a100-sxm4-80gb",
                                                               "num_gpus": 8},
                               "parallel": {"tp": 8}, "recompute": {"policy": policy},
                               "batch": {"micro_batch_size": 1, "global_batch_size": 4}})
        hidden, exposed = (estimate_plan(plan, runtime=rt).time for rt in (megatron, plain))
        saved[policy] = exposed["tp_comm"] - hidden["tp_comm"]
        assert hidden["tp_comm"] < exposed["tp_comm"]
    # the blocks' backward collectives hide; the recompute's forward ones stay whole
    assert saved["full"] == pytest.approx(saved["none"])
    with pytest.raises(ConfigError, match="async-dgrad"):
        dataclasses.replace(megatron, tp_comm_overlap_method="ring")


def test_the_optimizer_step_moves_what_each_runtime_s_step_moves() -> None:
    """Fused Adam's 28 bytes per parameter, plus the runtime's own: the gradient norm and
    Megatron's copy into 16-bit parameters and its whole-buffer zeroing; DeepSpeed's cast of
    the 16-bit partition to fp32 and copy back."""
    from autoplan.cost.compute import memory_time_s
    from autoplan.cost.params import total_params
    from autoplan.cost.step_time import ADAM_BYTES_PER_PARAM
    from autoplan.hardware import load_profile

    profile = load_profile("a100-sxm4-80gb")
    plan = plan_from_dict({"model": "gpt3-1.3b", "cluster": {"profile": "a100-sxm4-80gb",
                                                            "num_gpus": 1},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    n = total_params(plan.model_spec())
    expected = {"torchtitan": n * (ADAM_BYTES_PER_PARAM + 4.0),
                "megatron": n * (ADAM_BYTES_PER_PARAM + 10.0) + n * 4.0,  # fp32 main_grad
                "deepspeed": n * (ADAM_BYTES_PER_PARAM + 14.0)}
    for name, nbytes in expected.items():
        got = estimate_plan(plan, runtime=name).time["optimizer"]
        # the padded vocabulary adds a little; nothing else does on one GPU
        assert got == pytest.approx(float(memory_time_s(np.array(nbytes), profile)), rel=0.02)


def test_async_dgrad_hides_no_more_than_the_column_parallel_weight_gradients() -> None:
    """tp 16 over two A100 nodes: the input-gradient collectives outlast the QKV and fc1
    weight-gradient GEMMs they run beside, so those GEMMs bound what hides."""
    import dataclasses

    from autoplan.cost.compute import gemm_flops_per_layer, gemm_shapes_per_layer, gemm_time_s
    from autoplan.hardware import load_profile

    megatron = load_runtime("megatron")
    plain = dataclasses.replace(megatron, tp_comm_overlap_method="none")
    plan = plan_from_dict({**LLAMA8B, "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 16},
                           "parallel": {"dp": 1, "tp": 16}, "sequence_parallel": True,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    model, profile = plan.model_spec(), load_profile("a100-sxm4-80gb")
    hidden = (estimate_plan(plan, runtime=plain).time["tp_comm"]
              - estimate_plan(plan, runtime=megatron).time["tp_comm"])
    tokens, tp = np.array(float(model.seq_len)), np.array(16.0)
    gemms = gemm_flops_per_layer(model, tokens, tp)
    shapes = gemm_shapes_per_layer(model, tokens, tp)
    peak = profile.device.peak("bf16")
    column = float(sum(gemm_time_s(gemms[i], profile, peak, shapes[i]) for i in (0, 2)))
    assert 0 < hidden <= model.num_layers * column * (1 + 1e-6)
    uncapped = 0.25 * estimate_plan(plan, runtime=plain).time["tp_comm"]
    assert hidden < uncapped  # the cap binds here


@pytest.mark.parametrize(("zero", "gathers"), [(3, 4), (2, 1)])
def test_fsdp2_copies_around_its_collectives_are_not_hidden(zero, gathers) -> None:
    """torchtitan's FSDP2 (8 H100s, 2 micro-batches): each all-gather's copy-out (read and
    write 2 bytes per parameter; ZeRO-3 gathers in forward and backward of both micro-batches,
    ZeRO-2 once) and each reduce-scatter's copy-in (read 2, write the fp32 reduce dtype's 4,
    every micro-batch) add to the step; runtimes with contiguous buffers pay neither."""
    import dataclasses

    from autoplan.cost.compute import memory_time_s
    from autoplan.cost.params import total_params
    from autoplan.hardware import load_profile

    torchtitan = load_runtime("torchtitan")
    assert torchtitan.fsdp2_copies and not load_runtime("megatron").fsdp2_copies
    plan = plan_from_dict({**LLAMA8B, "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
                           "parallel": {"dp": 8}, "zero_stage": zero,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 16}})
    without = dataclasses.replace(torchtitan, fsdp2_copies=False)
    added = (estimate_plan(plan, runtime=torchtitan).time["dp_comm"]
             - estimate_plan(plan, runtime=without).time["dp_comm"])
    n = total_params(plan.model_spec())
    want = memory_time_s(np.array(n * (gathers * 4.0 + 2 * 6.0)), load_profile("h100-sxm-80gb"))
    assert added == pytest.approx(float(want), rel=0.01)  # the padded vocabulary adds a little


def test_scatter_gather_sends_one_slice_between_stages_and_gathers_it_in_the_node() -> None:
    """Megatron-LM 2021-22 (megatron-2022) without sequence parallelism: each of the tp ranks
    sends its 1/tp slice of the stage's replicated output over the network and the receiver
    all-gathers the slices over NVLink (Narayanan et al. 2021 §4.1); with sequence parallelism
    the tensor is already split and nothing changes."""
    from autoplan.cost import comm
    from autoplan.hardware import load_profile

    a100 = load_profile("a100-sxm4-80gb")
    # untied embeddings: the first and last stages sum no head gradient over pp_comm
    plan = {"model": "llama-3-70b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
            "parallel": {"dp": 1, "tp": 8, "pp": 8}, "recompute": {"policy": "full"},
            "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    on = load_runtime("megatron-2022")
    off = replace(on, pipeline_scatter_gather=False)
    assert on.pipeline_scatter_gather and not load_runtime("megatron").pipeline_scatter_gather

    def pp_comm(p: dict, traits) -> float:
        return estimate_plan(plan_from_dict(p), runtime=traits).time["pp_comm"]

    tensor = np.array(8192 * 1 * 8192 * 2.0)  # s x b x h, 16-bit
    eight, rounds = np.array(8.0), 2 * (64 + 8 - 1)  # fwd + bwd: m * vpp + pp - 1 each
    across = np.array(False)  # tp x dp = 8 ranks per stage: a stage is a node
    sliced = comm.p2p_time_s(tensor / 8, across, a100) + comm.collective_time_s(
        comm.ALL_GATHER, tensor, eight, np.array(True), a100, per_node=eight)
    assert pp_comm(plan, on) == pytest.approx(rounds * float(sliced), rel=1e-9)
    assert pp_comm(plan, off) == pytest.approx(rounds * float(comm.p2p_time_s(tensor, across, a100)),
                                               rel=1e-9)
    assert pp_comm(plan, on) < pp_comm(plan, off) / 3
    with_sp = {**plan, "sequence_parallel": True, "recompute": {"policy": "selective"}}
    assert pp_comm(with_sp, on) == pp_comm(with_sp, off)


def test_fa_triton_runs_at_flashattention_2_s_speed_over_the_papers_ratios() -> None:
    """Dao 2023 §4.1: FlashAttention-2 is 1.3-1.5x the Triton kernel forward, ~2x backward."""
    from autoplan.cost.attention_kernels import TRITON_FA_SLOWDOWN, attention_efficiency
    from autoplan.hardware import load_profile

    profile = load_profile("a100-sxm4-80gb")
    flops = np.array([1e12])
    fa2_f, fa2_b = attention_efficiency(profile, "fa2", flops, 2048.0)
    for kernel in ("fa-triton", "fa-triton@bf16"):
        f, b = attention_efficiency(profile, kernel, flops, 2048.0)
        assert f == pytest.approx(fa2_f / TRITON_FA_SLOWDOWN[0])
        assert b == pytest.approx(fa2_b / TRITON_FA_SLOWDOWN[1])
    assert 1.3 <= TRITON_FA_SLOWDOWN[0] <= 1.5 and TRITON_FA_SLOWDOWN[1] == 2.0
    # so a plan whose time is attention runs slower on the Triton kernel, and only there
    long = plan_from_dict({"model": "llama-3-8b", "cluster": {"profile": "a100-sxm4-80gb",
                                                             "num_gpus": 8},
                           "parallel": {"dp": 8}, "zero_stage": 3,
                           "recompute": {"policy": "full"},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    foundry, titan = load_runtime("llm-foundry"), load_runtime("torchtitan")
    fa2 = replace(foundry, attention_kernel="fa2")
    assert estimate_plan(long, runtime=foundry).step_time_s > estimate_plan(
        long, runtime=fa2).step_time_s
    assert titan.attention_kernel == "fa2"


def test_a_loss_kernel_without_casts_moves_its_own_bytes_in_every_precision() -> None:
    torch_ce = load_runtime("torchtitan")
    # the loss kernel alone (Composer's metric passes apart: test_train_metrics.py)
    fused = replace(load_runtime("llm-foundry"), train_metric_passes=0)
    assert torch_ce.loss_bytes("bf16") - torch_ce.loss_bytes("fp32") == 12.0  # the casts
    assert fused.loss_bytes("bf16") == 8.0 and fused.loss_bytes("fp32") == 16.0
    with pytest.raises(ConfigError, match="loss_casts"):
        replace(torch_ce, loss_bytes_per_logit=8.0)
    # flash_attn's cross-entropy keeps the 16-bit logits, not an fp32 softmax
    plan = plan_from_dict({**LLAMA8B, "zero_stage": 3})
    assert (estimate_plan(plan, runtime=fused).memory["activations"]
            < estimate_plan(plan, runtime=replace(fused, logit_bytes_saved=4.0,
                                                  logit_bytes_transient=6.0)
                            ).memory["activations"])


def test_llm_foundry_runs_fsdp_alone_with_whole_block_checkpointing() -> None:
    foundry = load_runtime("llm-foundry")
    fsdp = plan_from_dict({**LLAMA8B, "zero_stage": 3, "recompute": {"policy": "full"}})
    assert not estimate_plan(fsdp, runtime=foundry).reasons
    tp = plan_from_dict({**LLAMA8B, "zero_stage": 3, "parallel": {"dp": 4, "tp": 2}})
    (line,) = estimate_plan(tp, runtime=foundry).reasons
    assert "tp=2" in line and "data parallelism" in line and "\n" not in line
    piped = plan_from_dict({**LLAMA8B, "zero_stage": 2, "parallel": {"dp": 4, "pp": 2}})
    assert any("pp=2" in r for r in estimate_plan(piped, runtime=foundry).reasons)
    sel = plan_from_dict({**LLAMA8B, "zero_stage": 3, "recompute": {"policy": "selective"}})
    (line,) = estimate_plan(sel, runtime=foundry).reasons
    assert "selective recompute" in line and "none, full" in line
    # every block or none: not every 2nd block, which torchtitan runs
    half = plan_from_dict({**LLAMA8B, "zero_stage": 3,
                           "recompute": {"policy": "full", "num_layers": 16}})
    (line,) = estimate_plan(half, runtime=foundry).reasons
    assert "every block or none" in line and "num_layers=16" in line
    assert not estimate_plan(half, runtime="torchtitan").reasons
    # every other preset splits the model and runs selective recompute as before
    for name in ("megatron", "torchtitan", "deepspeed"):
        assert not any("cannot split" in r for r in estimate_plan(tp, runtime=name).reasons)
    with pytest.raises(ConfigError, match="parallel_dims"):
        replace(foundry, parallel_dims=("sp",))
    with pytest.raises(ConfigError, match="recompute_policies"):
        replace(foundry, recompute_policies=("full",))


def test_a_checkpoint_that_stops_early_does_not_rerun_the_blocks_last_gemm() -> None:
    """torch's non-reentrant checkpoint (early stop on by default) re-runs the block only up to
    the last tensor its forward saved: autograd saves the down projection's input before that
    GEMM runs, so it is not re-run. Counted here on a GPT block, then priced."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    from autoplan.cost import activations
    from autoplan.cost.block_time import block_times_s
    from autoplan.hardware import load_profile
    from autoplan.model_spec import load_model

    class Gemms(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("mm", "addmm"):
                self.count += 1
            return func(*args, **(kwargs or {}))

    h = 32
    block = torch.nn.ModuleDict({"qkv": torch.nn.Linear(h, 3 * h), "o": torch.nn.Linear(h, h),
                                 "fc1": torch.nn.Linear(h, 4 * h),
                                 "fc2": torch.nn.Linear(4 * h, h)})

    def forward(x):
        q, k, v = (t.unsqueeze(1) for t in block["qkv"](x).chunk(3, -1))
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + block["o"](attn.squeeze(1))
        return x + block["fc2"](torch.nn.functional.gelu(block["fc1"](x)))

    x = torch.randn(2, 8, h, requires_grad=True)
    backward_gemms = {}
    for early in (True, False):
        with torch.utils.checkpoint.set_checkpoint_early_stop(early):
            y = checkpoint(forward, x, use_reentrant=False)
            mode = Gemms()
            with mode:
                y.sum().backward()
        backward_gemms[early] = mode.count
    # backward: 2 GEMMs per forward GEMM (8); the recompute adds 3 of the 4 forward GEMMs
    assert (backward_gemms[True], backward_gemms[False]) == (8 + 3, 8 + 4)

    model, profile = load_model("gpt3-1.3b"), load_profile("a100-sxm4-80gb")
    one = np.array([1.0])
    parts = activations.activation_elements_per_layer(model, one, one, np.array([False]), one,
                                                      False)

    def times(runtime):
        return block_times_s(model, profile, "bf16", one, one, one, False, load_runtime(runtime),
                             parts)

    titan, megatron, foundry = times("torchtitan"), times("megatron"), times("llm-foundry")
    down = compute_gemm_time(model, profile)
    assert titan["full"] == pytest.approx(titan["forward"] - down, rel=1e-6)
    assert megatron["full"] == pytest.approx(megatron["forward"], rel=1e-6)  # reentrant
    assert foundry["full"] == pytest.approx(foundry["forward"], rel=1e-6)  # torch < 2.1


def compute_gemm_time(model, profile) -> float:
    """Seconds of one GPT block's MLP down projection for one sequence at tp 1, bf16."""
    from autoplan.cost import compute

    tokens, tp = np.array([float(model.seq_len)]), np.array([1.0])
    flops = compute.gemm_flops_per_layer(model, tokens, tp)[3]
    shape = compute.gemm_shapes_per_layer(model, tokens, tp)[3]
    return float(compute.gemm_time_s(flops, profile, profile.device.peak("bf16"), shape)[0])


def test_deepspeed_pipeline_engine_reduces_fp32_gradients_after_the_last_backward() -> None:
    """DeepSpeed's PipelineEngine with bf16 keeps and all-reduces BF16_Optimizer's fp32
    gradients, as its own step after the last backward; its ZeRO engine without a pipeline
    keeps and reduces 16-bit ones, hidden behind backward like any overlapped reduction."""
    from autoplan.cost.estimate import estimate_table
    from autoplan.cost.rows import rows_of
    from autoplan.hardware import load_profile
    from autoplan.model_spec import PRESETS
    from autoplan.plan_table import plan_to_row

    model, profile = PRESETS["gpt3-13b"], load_profile("a100-sxm4-80gb")
    base = {"model": "gpt3-13b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
            "zero_stage": 1, "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    piped = plan_from_dict({**base, "parallel": {"dp": 16, "tp": 1, "pp": 4}})
    flat = plan_from_dict({**base, "parallel": {"dp": 16, "tp": 4, "pp": 1}})
    rows = [plan_to_row(p, model) for p in (piped, flat)]
    table = {k: np.concatenate([row[k] for row in rows]) for k in rows[0]}
    ds = load_runtime("deepspeed")
    r = rows_of(table, model, "bf16", ds)
    # the fp32 buffer (4) beside the 16-bit gradients the engine keeps between backwards (2)
    assert list(r.reduce_bytes) == [4.0, 2.0] and list(r.grad_bytes) == [6.0, 2.0]
    assert list(r.accumulate_bytes) == [18.0, 0.0]
    assert list(rows_of(table, model, "fp16", ds).reduce_bytes) == [2.0, 2.0]
    # the same pipeline plan with the reduction overlapped as any runtime's: more of it hidden
    overlapped = replace(ds, name="overlapped", pipeline_engine_reduce=False)
    cut = {name: estimate_table(table, model, profile, "fp16", runtime=rt)["time_dp_comm"]
           for name, rt in (("engine", ds), ("overlapped", overlapped))}
    assert cut["engine"][0] > cut["overlapped"][0] and cut["engine"][1] == cut["overlapped"][1]


def test_deepspeed_runs_a_bf16_pipeline_at_zero_0_on_bf16_optimizer() -> None:
    """DeepSpeed 0.19 (engine._do_optimizer_sanity_check): a bf16 pipeline at ZeRO-0 runs
    BF16_Optimizer, which partitions its fp32 master and Adam states over dp as ZeRO-1 does and
    accumulates in bf16 (2 + 2 bytes of gradients, 6 bytes moved per micro-batch); at ZeRO-1
    it accumulates in fp32 only where export writes grad_accum_dtype fp32 (no reduce dtype
    asked, nothing offloaded); otherwise the ZeRO-1 optimizer keeps 16-bit gradients."""
    from autoplan.cost.rows import rows_of
    from autoplan.model_spec import PRESETS
    from autoplan.plan_table import plan_to_row

    model = PRESETS["gpt3-13b"]
    base = {"model": "gpt3-13b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
            "parallel": {"dp": 16, "pp": 4},
            "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    plans = [plan_from_dict({**base, "zero_stage": 0}),
             plan_from_dict({**base, "zero_stage": 1}),
             plan_from_dict({**base, "zero_stage": 1, "grad_reduce_dtype": "bf16"})]
    rows = [plan_to_row(p, model) for p in plans]
    table = {k: np.concatenate([row[k] for row in rows]) for k in rows[0]}
    r = rows_of(table, model, "bf16", load_runtime("deepspeed"))
    assert list(r.zero) == [1, 1, 1]
    assert list(r.grad_bytes) == [4.0, 6.0, 2.0]
    assert list(r.accumulate_bytes) == [6.0, 18.0, 0.0]
    assert list(r.reduce_bytes) == [2.0, 4.0, 2.0]


def test_bf16_optimizer_holds_both_gradients_and_adds_them_up_every_micro_batch() -> None:
    """Under DeepSpeed's pipeline a bf16 rank holds 2 + 4 + 2 bytes per parameter of weights,
    fp32 gradient buffer and kept 16-bit gradients (plus 12/dp of fp32 master and Adam), and
    each micro-batch's update_hp_grads moves 18 bytes per parameter (read 2, write the fp32
    copy 4, read it and the buffer 4 + 4, write 4): m of them per step, in the optimizer's
    part. An fp16 plan (no BF16_Optimizer) has neither."""
    from autoplan.cost import compute
    from autoplan.cost.estimate import estimate_plan
    from autoplan.cost.rows import rows_of
    from autoplan.cost.step_memory import activation_parts, memory_by_part
    from autoplan.hardware import ClusterSpec, load_profile
    from autoplan.model_spec import PRESETS
    from autoplan.plan_table import plan_to_row

    model, profile = PRESETS["gpt3-13b"], load_profile("a100-sxm4-80gb")
    base = {"model": "gpt3-13b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
            "zero_stage": 1, "parallel": {"dp": 16, "tp": 1, "pp": 4},
            "recompute": {"policy": "full"}}
    cluster = ClusterSpec(profile, 64)

    def est(precision: str, m: int):
        plan = plan_from_dict({**base, "precision": precision,
                               "batch": {"micro_batch_size": 1, "global_batch_size": 16 * m}})
        return estimate_plan(plan, cluster, model, runtime="deepspeed")

    bf16, fp16 = est("bf16", 8), est("fp16", 8)
    params = bf16.memory["params"] / 2.0  # the largest stage's 16-bit weights
    assert bf16.memory["grads"] == pytest.approx(6.0 * params, rel=1e-9)
    assert fp16.memory["grads"] == pytest.approx(2.0 * params, rel=1e-9)
    # eight micro-batches more cost eight more accumulation passes over the largest stage's
    # parameters, and nothing else of the optimizer's part
    plan = plan_from_dict({**base, "precision": "bf16",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 128}})
    ds = load_runtime("deepspeed")
    r = rows_of(plan_to_row(plan, model), model, "bf16", ds)
    psi = memory_by_part(model, profile, r, "bf16", False, ds,
                         activation_parts(model, r, False, ds, "bf16"))["mem_psi"]
    extra = est("bf16", 16).time["optimizer"] - bf16.time["optimizer"]
    one_pass = float(compute.memory_time_s(18.0 * psi, profile)[0])
    assert extra == pytest.approx(8 * one_pass, rel=1e-6)
    assert est("fp16", 16).time["optimizer"] == pytest.approx(fp16.time["optimizer"], rel=1e-9)


def test_torchtitan_prices_pytorchs_ring_attention() -> None:
    """torchtitan's context parallelism is PyTorch's ring attention on the K/V heads SDPA sees
    (repeated): across nodes (tp 8 fills each node) its gathers of the repeated heads outlast
    the first ring step, and its fp32 merges add to compute. autoplan's runtime all-gathers
    the grouped heads."""
    assert load_runtime("torchtitan").cp_exchange == "torch-ring"
    assert load_runtime("autoplan-cuda").cp_exchange == "all-gather"
    plan = plan_from_dict({"model": "llama-3-70b", "cluster": {"profile": "h100-sxm-80gb",
                                                               "num_gpus": 64},
                           "parallel": {"dp": 2, "tp": 8, "cp": 4}, "zero_stage": 3,
                           "sequence_parallel": True, "recompute": {"policy": "full"},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    titan = load_runtime("torchtitan")
    ring = estimate_plan(plan, runtime=titan)
    grouped = estimate_plan(plan, runtime=replace(titan, kv_repeated=False))
    gathered = estimate_plan(plan, runtime=replace(titan, cp_exchange="all-gather"))
    assert ring.time["cp_comm"] > grouped.time["cp_comm"] > 0.0
    assert ring.time["compute"] > gathered.time["compute"]
    with pytest.raises(ConfigError, match="cp_exchange"):
        runtime_from_dict({"name": "x", "cp_exchange": "ring"})


def test_the_2022_megatron_release_overlaps_its_input_gradient_all_reduce() -> None:
    """Megatron-LM 2022 (megatron/mpu/layers.py): the column-parallel backward launches its
    input-gradient all-reduce asynchronously beside the weight-gradient GEMM; the SC21 code of
    2021 ran every tensor-parallel all-reduce in line. Same plan, same kernels: only the
    exposed tensor-parallel time differs, by the two backward all-reduces at most."""
    plan = plan_from_dict({"model": "gpt3-175b", "cluster": {"profile": "a100-sxm4-80gb",
                                                              "num_gpus": 64},
                           "parallel": {"dp": 1, "tp": 8, "pp": 8},
                           "recompute": {"policy": "full"}, "attention": "eager",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 64}})
    old, new = (estimate_plan(plan, runtime=n) for n in ("megatron-2021", "megatron-2022"))
    assert load_runtime("megatron-2021").tp_comm_overlap_method == "none"
    assert load_runtime("megatron-2022").tp_comm_overlap_method == "async-dgrad"
    assert new.time["compute"] == old.time["compute"]
    # a forward (+ its recompute) and a backward with 2 + 2 all-reduces each: the backward
    # pair is at most 2 of the 6 counted
    assert old.time["tp_comm"] * (1 - 2 / 6) <= new.time["tp_comm"] < old.time["tp_comm"]


def test_the_2021_megatron_code_has_neither_sequence_parallelism_nor_selective_recompute(
) -> None:
    """Both came with Megatron-LM's 2022 release (Korthikanti et al. 2022); the user test of
    session 34 priced GPT-3 175B under megatron-2021 with both, without a word."""
    plan = {"model": "gpt3-175b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
            "parallel": {"dp": 1, "tp": 8, "pp": 8}, "sequence_parallel": True,
            "recompute": {"policy": "selective"}, "attention": "eager",
            "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    old = _refusals(plan, "megatron-2021")
    assert any("no sequence parallelism" in r and "megatron-2022" in r for r in old)
    assert any("no selective recompute" in r for r in old)
    assert _refusals(plan, "megatron-2022") == []
    full = {**plan, "sequence_parallel": False, "recompute": {"policy": "full"}}
    assert _refusals(full, "megatron-2021") == []


def test_megatron_before_2023_computes_attention_unfused_only() -> None:
    """Megatron-LM took FlashAttention (--use-flash-attn) in 2023: a 2021 or 2022 plan with
    attention flash is not what that code runs; today's megatron runs it."""
    plan = {"model": "gpt3-175b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 64},
            "parallel": {"dp": 1, "tp": 8, "pp": 8}, "recompute": {"policy": "full"},
            "attention": "flash", "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    for name in ("megatron-2021", "megatron-2022"):
        assert _refusals(plan, name) == [
            f"runtime {name} computes attention unfused only (Megatron-LM took FlashAttention "
            "in 2023, after its 2021 and 2022 releases): set attention eager, or price it as "
            "megatron"]
        assert _refusals({**plan, "attention": "eager"}, name) == []
    assert _refusals(plan, "megatron") == []


@pytest.mark.parametrize(("runtime", "refused"), [
    ("megatron", True), ("nemo", True),  # Transformer Engine: no fused attention below sm80
    ("torchtitan", False), ("autoplan", False),  # SDPA's memory-efficient kernel runs there
])
def test_transformer_engine_refuses_flash_attention_before_ampere(runtime: str,
                                                                  refused: bool) -> None:
    """On a V100 (sm70) TE's cuDNN and FlashAttention-2 backends do not run and it computes
    attention unfused: `attention: flash` under TE is refused there, with eager as the fix; on
    an A100 it runs. The same plan priced without the device is not refused."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.hardware import load_profile

    v100 = {"model": "gpt3-1.3b", "cluster": {"profile": "v100-sxm2-32gb", "num_gpus": 8},
            "parallel": {"dp": 8}, "zero_stage": 3, "precision": "fp16", "attention": "flash",
            "batch": {"micro_batch_size": 1, "global_batch_size": 8}}
    why = [r for r in estimate_plan(plan_from_dict(v100), runtime=runtime).reasons
           if "older than Ampere" in r]
    assert bool(why) is refused
    if refused:
        assert why == [f"runtime {runtime}: attention flash on V100-SXM2-32GB, older than Ampere "
                       "(no bf16 tensor cores): Transformer Engine's fused attention needs "
                       "compute capability 8.0 or later and computes attention unfused there; "
                       "set attention eager"]
    eager = estimate_plan(plan_from_dict({**v100, "attention": "eager"}), runtime=runtime)
    assert not [r for r in eager.reasons if "attention" in r]
    a100 = {**v100, "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 8}, "precision": "bf16"}
    assert not [r for r in estimate_plan(plan_from_dict(a100), runtime=runtime).reasons
                if "attention" in r]
    assert _refusals(v100, runtime) == []  # no device given: the device rules are not read
    assert not load_profile("v100-sxm2-32gb").device.peak_flops_per_s.get("bf16")


def _refusals(plan: dict, runtime: str) -> list[str]:
    from autoplan.cost.runtime_rules import refusals

    return refusals(plan_from_dict(plan), load_runtime(runtime))


def test_a_runtime_without_the_models_code_refuses_it() -> None:
    """DeepSpeed's experts are model code of its own (deepspeed.moe.layer.MoE) and llm-foundry's
    MPT has none: MoE, MLA and MTP models are refused there, and expert tensor parallelism goes
    with expert parallelism."""
    moe = {"model": "qwen3-30b-a3b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
           "parallel": {"dp": 8}, "zero_stage": 1,
           "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    assert any("no model code for routed experts" in r for r in _refusals(moe, "deepspeed"))
    assert not _refusals(moe, "megatron")
    split = {**moe, "parallel": {"dp": 4, "tp": 2, "etp": 2}, "zero_stage": 3}
    assert any("etp=2" in r for r in _refusals(split, "llm-foundry"))
    assert not _refusals(LLAMA8B, "deepspeed")


def test_torchtitan_replicates_only_as_the_sole_parallelism() -> None:
    """torchtitan applies FSDP whenever dp_shard or cp exceeds 1 and otherwise DDP, which
    raises "DDP has not supported > 1D parallelism" beside tp or pp."""
    for parallel in ({"dp": 4, "tp": 2}, {"dp": 2, "cp": 4}, {"dp": 1, "cp": 8}):
        plan = {**LLAMA8B, "parallel": parallel, "zero_stage": 0}
        assert any("only as the sole parallelism" in r for r in _refusals(plan, "torchtitan"))
        assert not any("sole parallelism" in r for r in _refusals(plan, "megatron"))
    assert not _refusals({**LLAMA8B, "zero_stage": 0, "precision": "fp32"}, "torchtitan")
    # in bf16 DDP is torch.autocast in torchtitan 0.2.2, not the FSDP mixed precision priced
    assert any("only through FSDP" in r
               for r in _refusals({**LLAMA8B, "zero_stage": 0}, "torchtitan"))


def test_megatron_refuses_what_transformer_engine_cannot_run() -> None:
    """Transformer Engine's fused attention runs 16-bit only and is the only way to context
    parallelism; latent attention's CP is TE's p2p ring only; Megatron-Core's grouped expert
    GEMM needs bf16 (validate_args). DeepSpeed has no fp8 training in its config."""
    ok = {**LLAMA8B, "parallel": {"dp": 4, "cp": 2}}
    assert not _refusals(ok, "megatron")
    cases = {"16 bits only": {**LLAMA8B, "precision": "fp32"},
             "through fused attention": {**ok, "attention": "eager"},
             "latent attention": {**ok, "model": "tiny-mla",
                                  "batch": {"micro_batch_size": 1, "global_batch_size": 8}}}
    for why, plan in cases.items():
        assert any(why in r for r in _refusals(plan, "megatron")), why
        assert not any("Transformer Engine" in r for r in _refusals(plan, "torchtitan"))
    moe = {"model": "qwen3-30b-a3b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
           "parallel": {"dp": 8}, "zero_stage": 1, "precision": "fp16",
           "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    assert any("grouped expert GEMM" in r for r in _refusals(moe, "megatron"))
    assert any("no fp8 training" in r for r in _refusals({**LLAMA8B, "precision": "fp8"},
                                                          "deepspeed"))


def test_torchtitan_0_3_keeps_grouped_heads_and_gathers_them() -> None:
    """torchtitan 0.3.0 (its wheel): attention takes the grouped K/V heads (enable_gqa), context
    parallelism all-gathers them (torch's flex_cp_allgather), FullAC has no early stop. A GQA
    model keeps fewer activation bytes and its CP sends the grouped heads, once exposed."""
    old, new = load_runtime("torchtitan"), load_runtime("torchtitan-0.3")
    assert (new.kv_repeated, new.cp_exchange, new.recompute_early_stop) == (
        False, "all-gather", False)
    assert (old.kv_repeated, old.cp_exchange, old.recompute_early_stop) == (
        True, "torch-ring", True)
    plan = plan_from_dict({**LLAMA8B, "parallel": {"dp": 4, "cp": 2}, "zero_stage": 3})
    a, b = (estimate_plan(plan, runtime=r) for r in (old, new))
    assert b.memory["activations"] < a.memory["activations"]
    assert b.runtime == "torchtitan-0.3" and b.error_band == a.error_band


def test_chunk_shares_hide_behind_the_chunks_after_them() -> None:
    """chunked_hidden_s: with vpp 3 and pp 4, a 3 s reduction is 1 s per chunk; chunk j hides
    behind its own backward (own / vpp = 0.1 s) and j x pp more chunk backwards: 0.1, 0.5 and
    0.9 s of its 1 s. A collective shorter than the windows hides whole; vpp 1 is the
    one-window case."""
    from autoplan.cost.dp_comm import chunked_hidden_s

    passes = 4.0 * np.arange(3)[:, None]
    hidden = chunked_hidden_s(np.array([3.0, 0.3, 3.0]), np.array([0.3, 0.3, 0.3]),
                              np.array([3.0, 3.0, 1.0]), passes)
    assert hidden == pytest.approx([0.1 + 0.5 + 0.9, 0.1 + 0.1 + 0.1, 0.3])


def test_megatron_core_syncs_each_interleaved_chunk_on_its_own() -> None:
    """Megatron-Core's interleaved schedule launches each chunk's gradient reduce-scatter when
    the chunk's last backward ends and gathers the next chunk's parameters a chunk ahead
    (RuntimeTraits.chunked_dp_sync): at dp 64 the exposed data-parallel time drops, and
    nothing else moves; without interleaving there is nothing to split."""
    base = {"model": "gpt3-175b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 4096},
            "parallel": {"dp": 64, "tp": 8, "pp": 8}, "zero_stage": 1,
            "sequence_parallel": True, "recompute": {"policy": "selective"},
            "batch": {"micro_batch_size": 1, "global_batch_size": 1536}}
    megatron = load_runtime("megatron")
    assert megatron.chunked_dp_sync and load_runtime("nemo").chunked_dp_sync
    whole = replace(megatron, chunked_dp_sync=False)
    interleaved = plan_from_dict({**base, "pipeline": {"schedule": "interleaved-1f1b",
                                                        "vpp": 3}})
    chunked, not_chunked = (estimate_plan(interleaved, runtime=rt) for rt in (megatron, whole))
    assert chunked.time["dp_comm"] < 0.8 * not_chunked.time["dp_comm"]
    assert chunked.time["compute"] == not_chunked.time["compute"]
    plain = plan_from_dict(base)
    assert (estimate_plan(plain, runtime=megatron).time["dp_comm"]
            == estimate_plan(plain, runtime=whole).time["dp_comm"])


def test_zero3_gathers_and_reductions_share_the_backward() -> None:
    """FSDP at ZeRO-3 gathers every unit in forward and again in backward and reduce-scatters in
    backward: the backward's gathers and the reductions hide in the same backward seconds, the
    forward's gathers in the forward's. On a communication-bound plan (13B, dp 512, one
    2,048-token sequence per rank) the hidden seconds never exceed the compute beside them (as
    long as the collectives make it last), which they did when the backward counted for both."""
    from autoplan.cost import dp_comm
    from autoplan.cost.rows import rows_of
    from autoplan.cost.stage_time import critical_stage_s
    from autoplan.cost.step_memory import activation_parts
    from autoplan.hardware import load_profile
    from autoplan.plan_table import plan_to_row

    profile, titan = load_profile("a100-sxm4-80gb"), load_runtime("torchtitan")
    plan = plan_from_dict({"model": "gpt3-13b",
                           "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 512},
                           "parallel": {"dp": 512}, "zero_stage": 3,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 512}})
    model = plan.model_spec()
    r = rows_of(plan_to_row(plan, model), model, "bf16", titan)
    crit = critical_stage_s(model, profile, r, "bf16", False, titan,
                            activation_parts(model, r, False, titan))
    z = dp_comm._zero_traffic(profile, r, titan, crit, np.full(1, 13e9), r.shard, r.tp)
    # the compute beside them, stretched by the slowdown they cause it
    ov = profile.efficiency.overlap * (1.0 + profile.efficiency.comm_slowdown)
    forward = r.m * crit["forward"] * ov
    backward = r.m * (crit["backward"] + crit["recompute"]) * ov
    hidden_gathers = np.minimum(z.gathers, z.gather_window)
    hidden = hidden_gathers + np.minimum(z.reductions, z.reduction_window)
    assert z.gathers + z.reductions > forward + backward  # communication-bound
    assert hidden <= forward + backward + 1e-12
    assert hidden_gathers <= z.gathers / 2 + forward


@pytest.mark.parametrize("tp", [2, 8])
def test_nanotron_keeps_its_column_gemms_gathered_inputs_under_sequence_parallelism(tp) -> None:
    """nanotron's 2024 column_linear all-gathers the sequence-sharded input and lets F.linear save
    it: the QKV and first MLP GEMMs keep 2sbh each whole on every tensor-parallel rank where
    Megatron keeps 2sbh/tp (sp_gathered_gemm_inputs). Measured against nanotron's own log the
    trait takes its four single-node rows without a pipeline from 18-44% under their logged
    peak to 7-12%."""
    plan = plan_from_dict({
        "model": {"name": "llama-1b", "num_layers": 24, "hidden_size": 2048, "num_heads": 32,
                  "num_kv_heads": 32, "ffn_hidden_size": 4096, "vocab_size": 50257,
                  "seq_len": 4096, "mlp": "swiglu", "norm": "rmsnorm", "position": "rope",
                  "bias": False, "tie_embeddings": True},
        "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
        "parallel": {"dp": 8 // tp, "tp": tp}, "sequence_parallel": True, "zero_stage": 1,
        "batch": {"micro_batch_size": 8, "global_batch_size": 64}, "precision": "bf16"})
    nanotron = load_runtime("nanotron")
    assert nanotron.sp_gathered_gemm_inputs and not load_runtime("megatron").sp_gathered_gemm_inputs
    shard = replace(nanotron, sp_gathered_gemm_inputs=False)
    gathered, sharded = estimate_plan(plan, runtime=nanotron), estimate_plan(plan, runtime=shard)
    sbh = 4096 * 8 * 2048
    per_layer = 2 * 2 * sbh * (1 - 1 / tp)  # two GEMM inputs, 16-bit, whole less the shard
    extra = gathered.memory["activations"] - sharded.memory["activations"]
    assert 24 * per_layer <= extra <= 25 * per_layer  # every block, and the one in backward
    assert gathered.time["step"] == pytest.approx(sharded.time["step"])
