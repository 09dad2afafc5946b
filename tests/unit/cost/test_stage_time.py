"""The pipeline's stages per micro-batch (cost/stage_time.py): a stage is its blocks' costs
times its layer count plus what its ends add, and a step waits on the slowest of the first,
largest and last stage."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import block_time, stage_time, step_memory, step_time
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import (
    Batch,
    ClusterRef,
    Parallel,
    Pipeline,
    Plan,
    Recompute,
    RecomputePolicy,
    Schedule,
)
from autoplan.plan_table import plan_to_row

LLAMA = PRESETS["llama-3-70b"]  # 80 blocks
MEGATRON = load_runtime("megatron")
PROFILE = step_time.priced_profile(load_profile("h100-sxm-80gb"), MEGATRON)


def _rows(pp: int, layers: tuple[int, ...] | None = None, recompute: str = "none"):
    plan = Plan(model="llama-3-70b", cluster=ClusterRef("h100-sxm-80gb", 8 * pp),
                parallel=Parallel(dp=1, tp=8, pp=pp), sequence_parallel=True,
                pipeline=Pipeline(schedule=Schedule.ONE_F_ONE_B, layers_per_stage=layers),
                batch=Batch(micro_batch_size=1, global_batch_size=32), zero_stage=1,
                recompute=Recompute(policy=RecomputePolicy(recompute)))
    r = rows_of(plan_to_row(plan, LLAMA), LLAMA, "bf16", MEGATRON)
    return r, step_memory.activation_parts(LLAMA, r, False, MEGATRON, "bf16")


def _total(stage: dict[str, np.ndarray]) -> float:
    return float((stage["compute"] + stage["recompute"] + stage["tp"] + stage["cp"]
                  + stage["ep"])[0])


def test_a_stage_without_ends_scales_with_its_blocks():
    r, parts = _rows(4)
    c = block_time.block_costs(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    zero = 0.0 * r.layers_max

    def middle(n: float) -> dict[str, np.ndarray]:
        return stage_time.stage_s(c, r, PROFILE, MEGATRON, np.array([n]), zero, zero)

    ten, twenty = middle(10.0), middle(20.0)
    for part in ("compute", "tp", "forward", "backward", "wgrad"):
        assert float(twenty[part][0]) == pytest.approx(2.0 * float(ten[part][0]), rel=1e-12)
    assert _total(middle(0.0)) == 0.0
    # no recompute: nothing re-run, whatever the policy's per-layer cost would be
    assert float(ten["recompute"][0]) == 0.0


def test_full_recompute_adds_one_forward_per_block():
    r, parts = _rows(4, recompute="full")
    c = block_time.block_costs(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    zero = 0.0 * r.layers_max
    stage = stage_time.stage_s(c, r, PROFILE, MEGATRON, np.array([20.0]), zero, zero)
    assert float(stage["recompute"][0]) == pytest.approx(20.0 * float(c.block_s["full"][0]))
    assert 0.0 < float(c.block_s["full"][0]) <= float(c.block_s["forward"][0])


def test_the_head_sits_on_the_last_stage_and_the_step_waits_on_the_slowest():
    """Even 20-block stages: the last adds the output layer and its loss, so it is the critical
    one; moving four of its blocks to the first makes the first the critical one."""
    r, parts = _rows(4)
    c = block_time.block_costs(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    first, middle, last = stage_time.stages_s(c, LLAMA, PROFILE, r, "bf16", MEGATRON)
    assert _total(last) > _total(middle)
    assert float(stage_time.loss_on_first(r)[0]) == 0.0
    crit = stage_time.critical_stage_s(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    assert float(crit["t_mb"][0]) == pytest.approx(_total(last))
    assert float(crit["holds_head"][0]) == 1.0
    # each other rank fills the pipeline in its own time: less than the slowest's
    assert 0.0 < float(crit["t_fill"][0]) < float(crit["t_mb"][0])

    r, parts = _rows(4, layers=(24, 20, 20, 16))
    crit = stage_time.critical_stage_s(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    c = block_time.block_costs(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    first, _, last = stage_time.stages_s(c, LLAMA, PROFILE, r, "bf16", MEGATRON)
    assert _total(first) > _total(last)
    assert float(crit["t_mb"][0]) == pytest.approx(_total(first))
    assert float(crit["holds_head"][0]) == 0.0


def test_without_a_pipeline_one_stage_holds_embedding_blocks_and_head():
    r, parts = _rows(1)
    assert float(stage_time.loss_on_first(r)[0]) == 1.0
    crit = stage_time.critical_stage_s(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    c = block_time.block_costs(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    blocks_only = 80.0 * float((c.block_s["forward"] + c.block_s["backward"] + c.block_s["dtensor"])[0])
    assert float(crit["compute"][0]) > blocks_only
    assert float(crit["holds_head"][0]) == 1.0


@pytest.mark.parametrize("sp", [False, True])
def test_megatrons_mlp_recompute_runs_one_mlp_forwards_collectives_again(sp) -> None:
    """--recompute-modules mlp wraps the MLP in Megatron's reentrant checkpoint: fc1's
    all-gather (sequence parallel) and fc2's all-reduce or reduce-scatter run again, one MLP
    forward's collectives, a quarter of the block's (forward and backward of attention and
    MLP)."""
    from autoplan.cost import step_memory
    from autoplan.plan import RecomputeModule

    plan = Plan(model="llama-3-70b", cluster=ClusterRef("h100-sxm-80gb", 8),
                parallel=Parallel(tp=8), sequence_parallel=sp, batch=Batch(1, 8),
                recompute=Recompute(policy=RecomputePolicy.SELECTIVE,
                                    modules=(RecomputeModule.MLP,)))
    r = rows_of(plan_to_row(plan, LLAMA), LLAMA, "bf16", MEGATRON)
    parts = step_memory.activation_parts(LLAMA, r, False, MEGATRON, "bf16")
    c = block_time.block_costs(LLAMA, PROFILE, r, "bf16", False, MEGATRON, parts)
    assert float(c.tp.recompute[0]) == pytest.approx(float(c.tp.collectives["layer"][0]) / 4)


def test_op_sac_stops_before_geLUs_down_projection_where_the_checkpoint_stops_early() -> None:
    """torchtitan's op-level SAC re-runs every second matmul (wk, wo, then w3 or GELU's w2),
    but an early-stopping checkpoint never re-runs GELU's w2: no backward needs its output."""
    from autoplan.cost import compute

    gelu, swiglu = PRESETS["gpt3-1.3b"], PRESETS["llama-3-8b"]
    assert compute.op_sac_recomputed_gemm_share(gelu, early_stop=True) < \
        compute.op_sac_recomputed_gemm_share(gelu, early_stop=False)
    assert compute.op_sac_recomputed_gemm_share(swiglu, early_stop=True) == \
        compute.op_sac_recomputed_gemm_share(swiglu, early_stop=False)
    h, f = gelu.hidden_size, gelu.ffn
    total = 4 * h * h + 2 * h * f  # wq, wk, wv, wo, w1, w2 (no GQA)
    assert compute.op_sac_recomputed_gemm_share(gelu, early_stop=True) == pytest.approx(
        2 * h * h / total)  # wk and wo
