"""Memory at the corners of the layout space: HSDP with routed experts, the host's share of an
offloaded MoE optimizer, ZeRO-3 under a pipeline that keeps its weights gathered, zero-bubble
with three chunks, GPipe without a pipeline, a tied head under ZB-V and fp32 optimizer offload.
Each pins what the runtime holds, so that a layout is never priced by a term its docstring
rules out."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import memory, step_memory
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.params import expert_params_per_rank, layer_params
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.model_spec import PRESETS
from autoplan.plan import (
    Batch,
    ClusterRef,
    Offload,
    Parallel,
    Pipeline,
    Plan,
    Recompute,
    RecomputePolicy,
    Schedule,
)
from autoplan.plan_table import plan_to_row

GIB = 2.0**30


def _plan(model: str, parallel: Parallel, gbs: int = 64, **fields) -> Plan:
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", parallel.world_size),
                parallel=parallel, batch=Batch(micro_batch_size=1, global_batch_size=gbs),
                **fields)


def test_hsdp_shards_the_routed_experts_over_the_shard_group_only() -> None:
    """HSDP replicates each shard group's states dp / dp_shard times; the experts' too."""
    mixtral = PRESETS["mixtral-8x7b"]
    kw = {"zero_stage": 3, "recompute": Recompute(policy=RecomputePolicy.FULL)}
    whole = estimate_plan(_plan("mixtral-8x7b", Parallel(dp=16), **kw), runtime="autoplan-cuda")
    hsdp = estimate_plan(_plan("mixtral-8x7b", Parallel(dp=16, dp_shard=2), **kw),
                         runtime="autoplan-cuda")
    experts = float(expert_params_per_rank(mixtral, np.array(1.0), np.array(1.0),
                                           np.array(float(mixtral.num_layers))))
    # weights, gradients and optimizer (2 + 4 + 4 + 8 bytes under FSDP2's fp32 sharded params:
    # at least the 12 of master weights and Adam) of the experts over 2 ranks, not 16
    grown = hsdp.memory["total"] - whole.memory["total"]
    assert grown > 12.0 * experts * (1 / 2 - 1 / 16)
    r = rows_of(plan_to_row(_plan("mixtral-8x7b", Parallel(dp=16, dp_shard=2), **kw), mixtral),
                mixtral, "bf16", load_runtime("autoplan-cuda"))
    assert float(r.expert_shard[0]) == 2.0


def test_an_offloaded_moe_optimizer_puts_the_experts_states_on_the_host() -> None:
    """What leaves the device arrives on the host: the device's optimizer bytes fall by the
    experts' states too, and the host holds them (16 bytes per parameter: fp32 master,
    gradient, Adam m and v)."""
    parallel = Parallel(dp=8, ep=8)
    kept = estimate_plan(_plan("mixtral-8x7b", parallel, zero_stage=1), runtime="megatron")
    moved = estimate_plan(_plan("mixtral-8x7b", parallel, zero_stage=1,
                                offload=Offload(optimizer=True)), runtime="megatron")
    left_device = kept.memory["optimizer"] - moved.memory["optimizer"]
    # the host holds the 12 bytes of optimizer state that left, plus the 4-byte gradient shard
    assert moved.memory["host_total"] == pytest.approx(left_device * 16 / 12, rel=1e-6)


def test_zero3_never_costs_more_than_zero2_where_a_pipeline_keeps_the_weights_gathered() -> None:
    """Under torch.distributed.pipelining's deferred reshard (torchtitan's FSDP + PP) ZeRO-3
    keeps the stage's 16-bit weights whole, as ZeRO-2 does: no per-unit gather buffers on
    top, and the same parameters, gradients and optimizer shards."""
    parallel = Parallel(dp=8, pp=2)
    z2 = estimate_plan(_plan("llama-3.1-8b", parallel, zero_stage=2), runtime="torchtitan")
    z3 = estimate_plan(_plan("llama-3.1-8b", parallel, zero_stage=3), runtime="torchtitan")
    assert z3.memory["total"] == pytest.approx(z2.memory["total"])
    # without a pipeline ZeRO-3 reshards each unit and holds three gathered ones
    flat = Parallel(dp=8)
    z3_flat = estimate_plan(_plan("llama-3.1-8b", flat, zero_stage=3), runtime="torchtitan")
    z2_flat = estimate_plan(_plan("llama-3.1-8b", flat, zero_stage=2), runtime="torchtitan")
    assert z3_flat.memory["buffers"] > z2_flat.memory["buffers"]
    assert z3_flat.memory["params"] < z2_flat.memory["params"]


def test_zero_bubble_with_three_chunks_holds_pp_layer_sets_on_its_last_rank() -> None:
    """Interleaved 1F1B's last rank holds (vpp - 1) * pp + 1 chunks (torch's
    get_rank_warmup_ops: (n_local_stages - 1) * microbatches_per_round on the last stage),
    pp - (pp - 1)/vpp layer sets: 2.5 at pp 4, vpp 2. torch's ScheduleInterleavedZeroBubble
    keeps every chunk until its deferred W (stage_backward_input retains the graph): (vpp - 1)
    * pp + pp chunks, pp = 4 layer sets at vpp 3 (pipeline.zero_bubble_held), beside the
    gradients its last pp chunks' W steps wait on (pipeline.deferred_weight_grads)."""
    model = PRESETS["llama-3.1-8b"]
    rt = load_runtime("torchtitan")

    def last_rank(schedule: Schedule) -> float:
        plan = _plan("llama-3.1-8b", Parallel(dp=2, pp=4),
                     pipeline=Pipeline(schedule=schedule, vpp=2 if schedule is
                                       Schedule.INTERLEAVED_1F1B else 3))
        r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
        parts = step_memory.activation_parts(model, r, False, rt, "bf16")
        acts = step_memory.stage_activation_bytes(model, r, "bf16", False, rt, parts)
        waiting = 4 / 3 * float(r.layers_last[0] * parts["wgrad_inputs"][0])
        if schedule is not Schedule.ZERO_BUBBLE:
            waiting = 0.0
        return float(acts.last[0] - acts.logits[0] - waiting) / float(acts.ends[1][0])

    inter = last_rank(Schedule.INTERLEAVED_1F1B)
    zb3 = last_rank(Schedule.ZERO_BUBBLE)
    # and the block whose backward runs (memory.backward_wavefront_bytes), a few % of a set
    assert inter == pytest.approx(2.5, abs=0.1) and zb3 == pytest.approx(4.0, abs=0.1)


def test_gpipe_without_a_pipeline_is_gradient_accumulation() -> None:
    """With pp = 1 there is nothing to fill: GPipe holds one micro-batch's logits, as 1F1B."""
    one = estimate_plan(_plan("llama-3.1-8b", Parallel(dp=8), gbs=64), runtime="torchtitan")
    gpipe = estimate_plan(_plan("llama-3.1-8b", Parallel(dp=8), gbs=64,
                                pipeline=Pipeline(schedule=Schedule.GPIPE)), runtime="torchtitan")
    assert gpipe.memory["activations"] == pytest.approx(one.memory["activations"])


def test_zb_v_keeps_one_copy_of_a_tied_head_on_rank_0() -> None:
    """ZB-V's rank 0 holds stage 0 and the last: a tied head is the embedding's own parameter
    there (runtime/tied_embeddings.py `retie`), an untied one a second table."""
    rt = load_runtime(None)

    def rank0_tables(name: str) -> float:
        model = PRESETS[name]
        plan = _plan(name, Parallel(dp=4, pp=2),
                     pipeline=Pipeline(schedule=Schedule.ZERO_BUBBLE, vpp=2))
        r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
        psi = step_memory._stage_states(model, r, "bf16", rt)[3]  # rank 0's, the largest
        blocks = float(r.layers_first[0]) * layer_params(model)
        return (float(psi[0]) - blocks) / (float(r.vocab[0]) * model.hidden_size)

    assert rank0_tables("gpt3-1.3b") == pytest.approx(1.0, abs=0.05)  # tied
    assert rank0_tables("llama-3.1-8b") == pytest.approx(2.0, abs=0.05)  # untied


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_offloaded_optimizer_holds_16_bytes_per_parameter_on_the_host(precision) -> None:
    """fp32 master (the fp32 run's own weights), gradient, Adam m and v: 16 bytes either way."""
    host = memory.host_state_bytes(np.array([1e9]), np.array([1.0]), precision,
                                   np.array([True]), np.array([False]))
    assert float(host[0]) == pytest.approx(16e9)
