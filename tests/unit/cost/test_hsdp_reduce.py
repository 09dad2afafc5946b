"""The cost model's HSDP (parallel.dp_shard) and gradient reduce dtype (grad_reduce_dtype)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoplan.cost import comm, params
from autoplan.cost.estimate import estimate_table
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision, ReduceDtype
from autoplan.plan_table import plan_to_row

MODEL = load_model("llama-3.1-8b")
PROFILE = load_profile("h100-sxm-80gb")
NO_OVERLAP = dataclasses.replace(load_runtime("torchtitan"), overlap_dp_comm=False,
                                 overlap_param_gather=False)
"""Every data-parallel collective exposed, so time_dp_comm is their sum."""


def _plan(dp: int, zero: int, dp_shard: int | None = None,
          reduce: ReduceDtype | None = None) -> Plan:
    return Plan(model="llama-3.1-8b", cluster=ClusterRef("h100-sxm-80gb", dp),
                batch=Batch(1, 2 * dp), parallel=Parallel(dp=dp, dp_shard=dp_shard),
                zero_stage=zero, precision=Precision.BF16, grad_reduce_dtype=reduce)


def _estimate(plan: Plan, runtime=NO_OVERLAP) -> dict[str, np.ndarray]:
    return estimate_table(plan_to_row(plan, MODEL), MODEL, PROFILE, "bf16", "flash", runtime)


def test_bf16_reduce_halves_the_all_reduce_bytes() -> None:
    """ZeRO-0 on 64 GPUs: a bf16 all-reduce of 8B gradients takes half the fp32 one's
    bandwidth time (its latency is the same and small beside 16 GB)."""
    fp32 = _estimate(_plan(64, 0, reduce=ReduceDtype.FP32))["time_dp_comm"][0]
    bf16 = _estimate(_plan(64, 0, reduce=ReduceDtype.BF16))["time_dp_comm"][0]
    assert 0.5 <= bf16 / fp32 < 0.52


def test_null_reduce_dtype_is_the_runtimes_default() -> None:
    """null prices the runtime's own reduce bytes: fp32 for torchtitan's bf16 runs, bf16 for
    DeepSpeed's (RuntimeTraits.reduce_bytes_bf16)."""
    for name, default in (("torchtitan", ReduceDtype.FP32), ("deepspeed", ReduceDtype.BF16)):
        runtime = load_runtime(name)
        got = _estimate(_plan(64, 1), runtime)["time_step"][0]
        assert got == _estimate(_plan(64, 1, reduce=default), runtime)["time_step"][0]
    r = rows_of(plan_to_row(_plan(64, 1), MODEL), MODEL, "bf16", load_runtime("deepspeed"))
    assert float(r.reduce_bytes[0]) == 2.0


def test_hsdp_states_are_those_of_its_shard_group() -> None:
    """ZeRO-3 over dp 64 in shard groups of 8 keeps per GPU what ZeRO-3 over dp 8 keeps: the
    states divide by the shard group only."""
    hsdp = _estimate(_plan(64, 3, dp_shard=8))
    group = _estimate(_plan(8, 3))
    full = _estimate(_plan(64, 3))
    for part in ("mem_params", "mem_grads", "mem_optimizer"):
        assert hsdp[part][0] == pytest.approx(group[part][0], rel=1e-12)
    assert hsdp["mem_optimizer"][0] == pytest.approx(8 * full["mem_optimizer"][0], rel=1e-12)


def test_hsdp_adds_one_replica_all_reduce_of_the_shard_per_reduction() -> None:
    """HSDP 8 x 8 costs what its shard group of 8 costs plus, per FSDP unit, an all-reduce of
    the unit's 1/8 gradient shard over the 8 replicas (64 ranks apart at tp 1: across
    nodes), priced with comm.collective_time_s."""
    plan = _plan(64, 2, dp_shard=8)
    r = rows_of(plan_to_row(plan, MODEL), MODEL, "bf16", NO_OVERLAP)
    assert float(r.replicate[0]) == 8 and float(r.shard[0]) == 8
    hsdp = _estimate(plan)
    group = _estimate(_plan(8, 2))
    psi, _ = params.params_per_rank(MODEL, r.tp, r.pp, r.layers_first, r.layers_last)
    units = float(r.layers_max[0]) + 1.0
    g_shard = float(psi[0]) * float(r.reduce_bytes[0]) / 8 / units
    gpn = PROFILE.gpus_per_node
    replica = units * comm.collective_time_s(
        comm.ALL_REDUCE, np.array(g_shard), np.array(8.0), comm.intra_node(8.0, 8.0, gpn),
        PROFILE, per_node=comm.members_per_node(8.0, 8.0, gpn))
    extra = (hsdp["time_dp_comm"][0] - group["time_dp_comm"][0]) / float(r.m[0])  # ZeRO-2:
    # one reduction per micro-batch
    # the once-per-step loss and norm syncs span 64 ranks instead of 8 (tiny, latency only)
    assert extra == pytest.approx(float(replica), rel=0.02)


def test_estimate_names_what_a_runtime_cannot_run() -> None:
    """runtime_refusals: torchtitan reduces in fp32 only, DeepSpeed has no HSDP, Megatron's
    HSDP is ZeRO-1 only; autoplan's own runtime runs all of them."""
    from autoplan.cost.estimate import runtime_refusals

    hsdp3_bf16 = _plan(64, 3, dp_shard=8, reduce=ReduceDtype.BF16)
    assert runtime_refusals(hsdp3_bf16, load_runtime("autoplan-cuda")) == []
    [why] = runtime_refusals(hsdp3_bf16, load_runtime("torchtitan"))
    assert "cannot reduce gradients in bf16" in why
    [why] = runtime_refusals(_plan(64, 1, dp_shard=8), load_runtime("deepspeed"))
    assert "no HSDP (parallel.dp_shard) at ZeRO stage 1 (it runs it at: none)" in why
    assert runtime_refusals(_plan(64, 1, dp_shard=8), load_runtime("megatron")) == []


def test_megatron_keeps_its_gradient_buffer_in_the_reduce_dtype() -> None:
    """Megatron-Core allocates its grad buffer in fp32 only when grad_reduce_in_fp32
    (RuntimeTraits.grads_in_reduce_dtype): a plan reducing in bf16 keeps 2 bytes per gradient,
    one reducing in fp32 (or null, Megatron's bf16 default) 4. FSDP2 (torchtitan) keeps its
    sharded gradients' dtype whatever the wire carries."""
    def grads(runtime, reduce):
        return _estimate(_plan(8, 1, reduce=reduce), load_runtime(runtime))["mem_grads"][0]

    fp32 = grads("megatron", ReduceDtype.FP32)
    assert fp32 > 4.0 * 8e9 and grads("megatron", None) == fp32  # 4 bytes of each 8B+ gradient
    assert grads("megatron", ReduceDtype.BF16) == fp32 / 2.0
    assert grads("torchtitan", ReduceDtype.BF16) == grads("torchtitan", ReduceDtype.FP32)


def test_hsdp_with_one_rank_per_shard_is_still_wrapped_in_fsdp2() -> None:
    """HSDP with dp_shard 1 (plain replication over FSDP2's 2-D mesh) in fp32: the runtime wraps
    the model in FSDP2 whenever dp * cp > 1 (runtime/data_parallel.uses_fsdp), so the cost
    model prices FSDP's units too, not DDP."""
    from autoplan.cost.rows import rows_of
    from autoplan.cost.runtimes import load_runtime
    from autoplan.plan import plan_from_dict
    from autoplan.plan_table import plan_to_row
    from autoplan.runtime.data_parallel import uses_fsdp
    from autoplan.runtime.mesh import ParallelDims

    plan = plan_from_dict({"model": "gpt3-125m",
                           "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 4},
                           "parallel": {"dp": 4, "dp_shard": 1}, "zero_stage": 1,
                           "precision": "fp32",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 4}})
    m = plan.model_spec()
    r = rows_of(plan_to_row(plan, m), m, "fp32", load_runtime("autoplan-cuda"))
    dims = ParallelDims(dp=4, zero_stage=1, hsdp_shard=1)
    assert bool(r.fsdp[0]) == uses_fsdp(dims, plan.precision, plan.offload)


def test_sharded_experts_are_priced_on_fsdp2_as_the_runtime_wraps_them() -> None:
    """An fp32 ZeRO-0 plan with expert parallelism: the runtime wraps it in FSDP2 (the experts'
    per-group reductions need it), and the cost model, asking the same rule
    (plan_rules.data_parallel_wrappers), prices FSDP2 too, not DDP."""
    from autoplan.cost.rows import rows_of
    from autoplan.cost.runtimes import load_runtime
    from autoplan.plan import plan_from_dict
    from autoplan.plan_table import plan_to_row
    from autoplan.runtime.data_parallel import uses_ddp, uses_fsdp
    from autoplan.runtime.mesh import ParallelDims

    plan = plan_from_dict({"model": "tiny-moe", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "parallel": {"dp": 2, "ep": 2}, "zero_stage": 0, "precision": "fp32",
                           "batch": {"micro_batch_size": 1, "global_batch_size": 2}})
    m = plan.model_spec()
    r = rows_of(plan_to_row(plan, m), m, "fp32", load_runtime("autoplan-cpu"))
    dims = ParallelDims(dp=2, ep=2)
    assert uses_fsdp(dims, plan.precision, plan.offload) and not uses_ddp(
        dims, plan.precision, plan.offload)
    assert bool(r.fsdp[0])
