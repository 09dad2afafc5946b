"""The cost model's price of pipeline stages that hold no block (issue #12, Deliver 1).

An embedding-only first stage and a loss-only last stage: the ranks between hold the blocks'
states and activations, the bubble is filled by the empty stages in their own (short) time,
and recompute still counts in the hardware FLOPs.
"""

from __future__ import annotations

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.params import layer_params
from autoplan.model_spec import load_model
from autoplan.plan import (
    Batch,
    ClusterRef,
    Parallel,
    Pipeline,
    Plan,
    Recompute,
    RecomputePolicy,
)

MODEL = "llama-3-8b"  # 32 blocks


def _plan(pp: int, lps: tuple[int, ...] | None, policy: str = "none") -> Plan:
    return Plan(model=MODEL, cluster=ClusterRef("h100-sxm-80gb", 8 * pp), batch=Batch(1, 64),
                parallel=Parallel(dp=8, pp=pp), pipeline=Pipeline(layers_per_stage=lps),
                zero_stage=0, recompute=Recompute(policy=RecomputePolicy(policy)))


def test_middle_ranks_states_are_priced_between_empty_end_stages() -> None:
    """[0, 16, 16, 0]: ranks 1 and 2 hold 16 blocks each; their weights, gradients and
    optimizer states are the plan's peak, not rank 0's embedding alone."""
    got = estimate_plan(_plan(4, (0, 16, 16, 0)))
    states = sum(got.memory[k] for k in ("params", "grads", "optimizer"))
    blocks = 16 * layer_params(load_model(MODEL))
    # ZeRO-0 mixed precision keeps at least 2 (weights) + 2 (gradients) + 12 (fp32 master and
    # Adam moments) bytes per parameter of the rank
    assert states >= 16 * blocks
    even = estimate_plan(_plan(4, (8, 8, 8, 8)))
    assert got.memory["total"] > even.memory["total"]


def test_empty_end_stages_fill_the_bubble_in_their_own_time() -> None:
    """[0, 32, 0] on three ranks runs like one stage with two short ones around it: its bubble
    is a small fraction of (pp - 1) / m of the step, which prices a stage of blocks."""
    got = estimate_plan(_plan(3, (0, 32, 0)))
    m = 64 // 8  # micro-batches per replica
    busy = got.time["compute"] + got.time["recompute"]
    assert got.time["pp_bubble"] < 0.1 * (3 - 1) / m * busy
    # the two real stages of [0, 16, 16, 0] leave a one-stage bubble, as pp 2 [16, 16] does
    two = estimate_plan(_plan(4, (0, 16, 16, 0)))
    pp2 = estimate_plan(_plan(2, (16, 16)))
    assert 0.5 * pp2.time["pp_bubble"] < two.time["pp_bubble"] < 1.5 * pp2.time["pp_bubble"]


def test_recompute_counts_in_hfu_with_an_embedding_only_first_stage() -> None:
    got = estimate_plan(_plan(4, (0, 16, 16, 0), "full"))
    assert got.hfu > 1.2 * got.mfu
