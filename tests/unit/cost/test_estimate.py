"""End-to-end estimates: the claims autoplan was founded on, and one table == many plans."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoplan.cost.estimate import estimate_plan, estimate_table
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import plan_from_dict
from autoplan.plan_table import COLUMNS, plan_to_row

GPT3_BASE = {"model": "gpt3-175b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 1024},
             "zero_stage": 1, "attention": "eager"}


def _plan(**fields):
    return plan_from_dict({**GPT3_BASE, **fields})


def test_zero_offload_fits_13b_on_one_v100() -> None:
    # Ren et al. 2021 (ZeRO-Offload), section 1 and Figure 7: a 13B model trains on a single
    # 32 GB V100 only with the optimizer offloaded; plain data parallel and ZeRO-2 alone OOM.
    base = {"model": "gpt3-13b", "cluster": {"profile": "v100-sxm2-32gb", "num_gpus": 1},
            "batch": {"micro_batch_size": 1, "global_batch_size": 1}, "precision": "fp16",
            "attention": "eager", "recompute": {"policy": "full"}}
    # ZeRO-Offload is DeepSpeed's: fp16 weights on the GPU, fp32 master and Adam on the host.
    # autoplan's own runtime keeps FSDP2's fp32 shards on the device (runtime/offload.py), so
    # under its traits the same plan does not fit (checked below).
    plain = estimate_plan(plan_from_dict({**base, "zero_stage": 0}), runtime="deepspeed")
    zero2 = estimate_plan(plan_from_dict({**base, "zero_stage": 2}), runtime="deepspeed")
    offload = estimate_plan(plan_from_dict({**base, "zero_stage": 2,
                                            "offload": {"optimizer": True}}), runtime="deepspeed")
    ours = estimate_plan(plan_from_dict({**base, "zero_stage": 2,
                                         "offload": {"optimizer": True}}))
    assert ours.runtime == "autoplan-cuda" and not ours.feasible
    assert ours.memory["params"] >= 4 * 12e9  # the fp32 shard stays on the one GPU
    assert not plain.feasible and not zero2.feasible
    assert plain.memory["shortfall"] > 100 * 2**30  # 16 bytes x 13B is far beyond 32 GiB
    assert offload.feasible, offload.reasons
    assert offload.memory["host_total"] > 150e9  # the 12 + 4 bytes per parameter moved to host
    assert offload.time["offload"] > 0


def test_gpt3_175b_sequence_parallel_and_selective_recompute_pay() -> None:
    # Korthikanti et al. 2022, Table 5 / Figure 1 and NeMo Megatron's published 175B configs:
    # TP8 PP8 mbs2 with SP + selective recompute vs TP8 PP16 mbs1 with full recompute, no SP,
    # priced as the Megatron that ran them (its reentrant checkpoint re-runs the whole block)
    fast = estimate_plan(_plan(parallel={"dp": 16, "tp": 8, "pp": 8}, sequence_parallel=True,
                               recompute={"policy": "selective"},
                               batch={"micro_batch_size": 2, "global_batch_size": 1536}),
                         train_tokens=300e9, runtime="megatron")
    slow = estimate_plan(_plan(parallel={"dp": 8, "tp": 8, "pp": 16},
                               recompute={"policy": "full"},
                               batch={"micro_batch_size": 1, "global_batch_size": 1536}),
                         train_tokens=300e9, runtime="megatron")
    assert fast.feasible and slow.feasible
    assert 20 <= fast.days_to_train <= 28
    assert 30 <= slow.days_to_train <= 40
    assert slow.days_to_train >= 1.2 * fast.days_to_train
    assert slow.hfu > slow.mfu  # full recompute spends FLOPs that MFU does not count


def test_infeasible_plan_reports_every_reason_and_the_shortfall() -> None:
    est = estimate_plan(_plan(parallel={"dp": 1024}, zero_stage=0,
                              batch={"micro_batch_size": 3, "global_batch_size": 1536}))
    assert not est.feasible
    assert any("needs" in r and "short by" in r for r in est.reasons)
    assert any("global_batch_size" in r for r in est.reasons)  # 1536 % (1024 * 3) != 0
    capacity = load_profile("a100-sxm4-80gb").device.memory_bytes
    assert est.memory["shortfall"] == pytest.approx(est.memory["total"] - capacity)


def test_memory_savings_move_the_right_way() -> None:
    kw = dict(parallel={"dp": 16, "tp": 8, "pp": 8},
              batch={"micro_batch_size": 1, "global_batch_size": 1536})
    none = estimate_plan(_plan(**kw))
    sp = estimate_plan(_plan(**kw, sequence_parallel=True))
    sel = estimate_plan(_plan(**kw, sequence_parallel=True, recompute={"policy": "selective"}))
    full = estimate_plan(_plan(**kw, sequence_parallel=True, recompute={"policy": "full"}))
    acts = [e.memory["activations"] for e in (none, sp, sel, full)]
    assert acts[0] > acts[1] > acts[2] > acts[3]
    assert full.time["recompute"] > sel.time["recompute"] > 0 == none.time["recompute"]
    flat = dict(parallel={"dp": 128, "tp": 8, "pp": 1},
                batch={"micro_batch_size": 1, "global_batch_size": 1536})
    z1 = estimate_plan(_plan(**flat), runtime="deepspeed")
    z3 = estimate_plan(_plan(**flat, zero_stage=3), runtime="deepspeed")
    assert z3.memory["params"] < z1.memory["params"] / 100  # 2Ψ/N against 2Ψ (ZeRO paper)
    # FSDP2 (autoplan's runtime): the fp32 shard is the master, 4Ψ/N at any stage, and only
    # ZeRO-1/2 keep the whole 16-bit copy gathered
    fz1, fz3 = estimate_plan(_plan(**flat)), estimate_plan(_plan(**flat, zero_stage=3))
    assert fz1.memory["params"] - fz3.memory["params"] == pytest.approx(
        2 * fz1.num_params / 8, rel=0.02)
    assert z3.time["dp_comm"] > z1.time["dp_comm"]
    # under a pipeline, ZeRO-3 keeps weights gathered and gradients whole across micro-batches
    piped = estimate_plan(_plan(**kw, zero_stage=3))
    assert piped.memory["params"] == pytest.approx(none.memory["params"])


def test_table_scores_equal_single_plan_scores() -> None:
    model = PRESETS["llama-3-8b"]
    profile = load_profile("h100-sxm-80gb")
    plans = []
    for tp, pp, zero, rc, sp in itertools.product((1, 2, 8), (1, 2, 4), (0, 1, 3), (
            "none", "selective", "full"), (False, True)):
        if sp and tp == 1:
            continue
        dp = 64 // (tp * pp)
        plans.append(plan_from_dict({
            "model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
            "parallel": {"dp": dp, "tp": tp, "pp": pp}, "zero_stage": zero,
            "sequence_parallel": sp, "recompute": {"policy": rc},
            "batch": {"micro_batch_size": 1, "global_batch_size": 512}}))
    rows = [plan_to_row(p, model) for p in plans]
    table = {k: np.concatenate([r[k] for r in rows]) for k in COLUMNS}
    cols = estimate_table(table, model, profile, "bf16", "flash")
    cluster = ClusterSpec(profile, 64)
    for i, plan in enumerate(plans):
        one = estimate_plan(plan, cluster, model)
        assert cols["time_step"][i] == pytest.approx(one.time["step"], rel=1e-12)
        assert cols["mem_total"][i] == pytest.approx(one.memory["total"], rel=1e-12)
    assert np.all(np.isfinite(cols["time_step"])) and np.all(cols["mfu"] < 1)


def test_context_parallelism_splits_activations_and_costs_kv_gathers() -> None:
    base = {"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
            "zero_stage": 3, "batch": {"micro_batch_size": 1, "global_batch_size": 64}}
    one = estimate_plan(plan_from_dict({**base, "parallel": {"dp": 64}}))
    cp8 = estimate_plan(plan_from_dict({**base, "parallel": {"dp": 8, "cp": 8}}))
    assert cp8.memory["activations"] < one.memory["activations"] / 4
    assert one.time["cp_comm"] == 0
    # the runtime's K/V all-gather and dK/dV reduce-scatter are not hidden (comm.py), inside
    # a node and across nodes (tp 8 fills a node, so the cp group spans InfiniBand)
    assert cp8.time["cp_comm"] > 0
    slow = estimate_plan(plan_from_dict({**base, "parallel": {"dp": 1, "tp": 8, "cp": 8},
                                         "batch": {"micro_batch_size": 1,
                                                   "global_batch_size": 8}}))
    assert slow.time["cp_comm"] > 0


LLAMA = {"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
         "zero_stage": 1, "recompute": {"policy": "full"}}


def test_zero_bubble_v_schedule_puts_the_head_on_rank_zero() -> None:
    kw = dict(parallel={"dp": 2, "pp": 4}, batch={"micro_batch_size": 1, "global_batch_size": 16})
    one_f = estimate_plan(plan_from_dict({**LLAMA, **kw}))
    zbv = estimate_plan(plan_from_dict({**LLAMA, **kw, "pipeline": {"schedule": "zero-bubble",
                                                                    "vpp": 2}}))
    head_bytes = 128256 * 4096 * (2 + 4 + 12 / 2)  # weights, fp32 grads, sharded Adam
    assert zbv.memory["total"] > one_f.memory["total"] + 0.9 * head_bytes


def test_gpipe_keeps_every_micro_batch_log_softmax() -> None:
    kw = dict(parallel={"dp": 1, "tp": 2, "pp": 4}, sequence_parallel=True,
              batch={"micro_batch_size": 1, "global_batch_size": 32})
    gpipe = estimate_plan(plan_from_dict({**LLAMA, **kw, "pipeline": {"schedule": "gpipe"}}))
    one_f = estimate_plan(plan_from_dict({**LLAMA, **kw}))
    saved = 4 * 8192 * 128256 / 2  # fp32 log-softmax of one micro-batch, vocab split by tp
    assert gpipe.memory["activations"] - one_f.memory["activations"] > 31 * saved


def test_pipeline_across_nodes_pays_network_latency() -> None:
    kw = dict(parallel={"tp": 4, "pp": 4}, batch={"micro_batch_size": 1, "global_batch_size": 16})
    inside = estimate_plan(plan_from_dict({**LLAMA, **kw, "cluster": {
        "profile": "h100-sxm-80gb", "num_gpus": 16}}))
    assert inside.time["pp_comm"] > 0
    # 16 GPUs over 8-GPU nodes: the stage-1 -> stage-2 boundary crosses InfiniBand
    from autoplan.cost.comm import intra_node
    assert not bool(intra_node(np.array(4), np.array(4), 8))


def test_host_work_of_fsdp_and_dtensor_optimizers_follows_the_runtime_wrapping() -> None:
    """FSDP2 wraps ZeRO >= 1 data parallelism (per unit and micro-batch hooks; DTensor
    parameters slow the optimizer per tensor); fp32 ZeRO-0 runs on DDP and pays neither."""
    import dataclasses

    from autoplan.cost.params import end_tensors, tensors_per_layer

    cpu = load_profile("cpu-gloo")
    base = dataclasses.replace(cpu, efficiency=dataclasses.replace(
        cpu.efficiency, fsdp_unit_overhead_s=0.0, dtensor_optimizer_overhead_s=0.0))
    prof = dataclasses.replace(base, efficiency=dataclasses.replace(
        base.efficiency, fsdp_unit_overhead_s=1e-3, dtensor_optimizer_overhead_s=1e-4))

    def parts(profile, **fields):
        plan = plan_from_dict({"model": "tiny", "precision": "fp32",
                               "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                               "parallel": {"dp": 2},
                               "batch": {"micro_batch_size": 2, "global_batch_size": 16},
                               **fields})
        return estimate_plan(plan, ClusterSpec(profile, 2)).time

    model = PRESETS["tiny"]
    zero1, zero1_base = parts(prof, zero_stage=1), parts(base, zero_stage=1)
    m, units = 4, model.num_layers + 1  # 16 / dp 2 / mbs 2 micro-batches; blocks and the root
    assert zero1["dp_comm"] - zero1_base["dp_comm"] == pytest.approx(m * units * 1e-3)
    tensors = model.num_layers * tensors_per_layer(model) + end_tensors(model)
    assert tensors == 69  # counted on the runtime's tiny model
    assert zero1["optimizer"] - zero1_base["optimizer"] == pytest.approx(tensors * 1e-4)
    assert parts(prof, zero_stage=0) == parts(base, zero_stage=0)  # DDP


def test_tied_embeddings_across_a_pipeline_pay_one_gradient_all_reduce() -> None:
    """The runtime sums the first and last stage's copies of a tied embedding every step."""
    import dataclasses

    tied = PRESETS["tiny"]
    untied = dataclasses.replace(tied, tie_embeddings=False)

    def pp_comm(model) -> float:
        plan = plan_from_dict({"model": model, "precision": "fp32", "parallel": {"pp": 2},
                               "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                               "pipeline": {"schedule": "1f1b"},
                               "batch": {"micro_batch_size": 2, "global_batch_size": 16}})
        return estimate_plan(plan, ClusterSpec(load_profile("cpu-gloo"), 2)).time["pp_comm"]

    tied = dataclasses.replace(tied, tie_embeddings=True)
    from autoplan.cost import comm

    prof = load_profile("cpu-gloo")
    grad = 4.0 * tied.vocab_size * tied.hidden_size  # fp32 gradient of the shared weight
    expect = comm.collective_time_s(comm.ALL_REDUCE, np.array([grad]), np.array([2.0]),
                                    np.array([True]), prof)[0]
    assert pp_comm(tied) - pp_comm(untied) == pytest.approx(expect)


def test_fp16_adds_the_overflow_verdict_to_the_per_step_syncs() -> None:
    def dp_comm(precision: str) -> float:
        plan = plan_from_dict({"model": "tiny", "precision": precision, "parallel": {"dp": 2},
                               "zero_stage": 1, "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                               "batch": {"micro_batch_size": 2, "global_batch_size": 16}})
        return estimate_plan(plan, ClusterSpec(load_profile("cpu-gloo"), 2)).time["dp_comm"]

    from autoplan.cost import comm

    one = comm.collective_time_s(comm.ALL_REDUCE, np.array([8.0]), np.array([2.0]),
                                 np.array([True]), load_profile("cpu-gloo"))[0]
    assert dp_comm("fp16") - dp_comm("bf16") == pytest.approx(one)


def test_tied_gradient_sum_follows_where_the_copies_live() -> None:
    """No sum under ZB-V (both copies on rank 0); the full gradient at ZeRO-0 under FSDP
    (bf16 runs on FSDP with a shard group of 1), a 1/dp shard at ZeRO >= 1."""
    import dataclasses

    tied = dataclasses.replace(PRESETS["gpt3-1.3b"], tie_embeddings=True)
    untied = dataclasses.replace(tied, tie_embeddings=False)

    def extra(**fields) -> float:
        def pp_comm(model) -> float:
            plan = plan_from_dict({"model": model, "precision": "bf16",
                                   "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 16},
                                   "batch": {"micro_batch_size": 1, "global_batch_size": 64},
                                   **fields})
            return estimate_plan(plan, ClusterSpec(load_profile("h100-sxm-80gb"), 16)
                                 ).time["pp_comm"]
        return pp_comm(tied) - pp_comm(untied)

    assert extra(parallel={"pp": 4, "dp": 4}, zero_stage=1,
                 pipeline={"schedule": "zero-bubble", "vpp": 2}) == 0.0
    zero0 = extra(parallel={"pp": 2, "dp": 8}, zero_stage=0, pipeline={"schedule": "1f1b"})
    zero1 = extra(parallel={"pp": 2, "dp": 8}, zero_stage=1, pipeline={"schedule": "1f1b"})
    assert zero0 > 4 * zero1 > 0.0  # 8x the bytes (less the fixed latency)


def test_sequence_parallel_norm_gradients_are_summed_per_micro_batch_under_zero2() -> None:
    """FSDP2 turns a Partial gradient into Replicate inside every micro-batch's reduce-scatter
    at ZeRO-2/3; the trainer sums them once per step otherwise."""
    def tp_comm(zero: int, gbs: int) -> float:
        plan = plan_from_dict({"model": "tiny", "precision": "fp32", "zero_stage": zero,
                               "parallel": {"tp": 2, "dp": 2}, "sequence_parallel": True,
                               "cluster": {"profile": "cpu-gloo", "num_gpus": 4},
                               "batch": {"micro_batch_size": 2, "global_batch_size": gbs}})
        return estimate_plan(plan, ClusterSpec(load_profile("cpu-gloo"), 4)).time["tp_comm"]

    # doubling the micro-batches doubles everything per micro-batch; the difference between
    # ZeRO-2 and ZeRO-1 is the norm sums, m - 1 extra of them
    d4 = tp_comm(2, 16) - tp_comm(1, 16)  # m = 4
    d8 = tp_comm(2, 32) - tp_comm(1, 32)  # m = 8
    assert d4 > 0.0
    assert d8 == pytest.approx(d4 * 7 / 3)


@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "deepseek-v3"])
def test_full_recompute_adds_one_forward_of_the_blocks_to_hfu(model) -> None:
    """HFU / MFU under full recompute is 1 + (the blocks' forward) / (the model's FLOPs): the
    same blocks the step's seconds re-run, routed experts and MLA included (Megatron's
    reentrant checkpoint re-runs the whole forward)."""
    from autoplan.cost import compute
    from autoplan.cost import moe as moe_cost
    from autoplan.model_spec import PRESETS
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Recompute, RecomputePolicy

    spec = PRESETS[model]
    plan = Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", 64),
                parallel=Parallel(dp=8, tp=8), batch=Batch(1, 64), zero_stage=1,
                recompute=Recompute(policy=RecomputePolicy.FULL))
    est = estimate_plan(plan, runtime="megatron")
    per_seq = (moe_cost.model_flops_per_sequence(spec) if spec.moe or spec.mla
               else compute.model_flops_per_sequence(spec))
    logits_fwd = 2.0 * spec.seq_len * spec.hidden_size * spec.vocab_size
    assert est.hfu / est.mfu == pytest.approx(1.0 + (per_seq / 3.0 - logits_fwd) / per_seq,
                                              rel=1e-3)


def test_an_early_stopping_checkpoint_is_not_credited_the_down_projection_in_hfu() -> None:
    """torchtitan's non-reentrant checkpoint stops before the MLP's down projection
    (RuntimeTraits.recompute_early_stop): its full recompute re-runs, and HFU counts, the
    block's forward less that GEMM; Megatron's reentrant checkpoint re-runs all of it."""
    from autoplan.cost import compute
    from autoplan.model_spec import PRESETS
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Recompute, RecomputePolicy

    spec = PRESETS["llama-3-8b"]
    plan = Plan(model="llama-3-8b", cluster=ClusterRef("h100-sxm-80gb", 8),
                parallel=Parallel(dp=8), batch=Batch(1, 8), zero_stage=3,
                recompute=Recompute(policy=RecomputePolicy.FULL))
    titan = estimate_plan(plan, runtime="torchtitan")
    mega = estimate_plan(plan, runtime="megatron")
    per_seq = compute.model_flops_per_sequence(spec)
    down = float(compute.gemm_flops_per_layer(spec, np.array(float(spec.seq_len)),
                                              np.array(1.0))[3]) * spec.num_layers
    assert (mega.hfu / mega.mfu - titan.hfu / titan.mfu) == pytest.approx(down / per_seq,
                                                                           rel=1e-3)
