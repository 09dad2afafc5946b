"""QK-NORM (model.qk_norm, Qwen3) under tensor parallelism: a two-block Qwen3-style model (q and k
RMS-normalised per head before RoPE, norms at eps 1e-6) at tp 2 with sequence parallelism, and
at tp 2 beside FSDP (dp 2, ZeRO-3), matches one process (fp32 losses, gradients at steps 1 and
3, parameters within 1e-5, plain SGD); each tp rank holds q_norm and k_norm whole (replicated,
not split by heads), and their gradients, each rank's partial sums over its own heads, are summed
over tp (left per rank, the parity check fails on them).
"""

from __future__ import annotations

import pytest

import autoplan.runtime.trainer  # noqa: F401  (the forked ranks inherit the import)
from autoplan.model_spec import load_model
from tests.dist.parity import compare, make_plan, merge_ranks, reference_plan, run_plan_rank

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

MODEL = load_model("tiny-llama").replace(name="tiny-qwen3-2l", num_layers=2, qk_norm=True,
                                         norm_eps=1e-6)
STEPS, CAPTURE = 3, (1, 3)
NORMS = ("layers.0.attention.q_norm.weight", "layers.1.attention.k_norm.weight")


def _rank(rank: int, world_size: int, plan) -> dict:
    return run_plan_rank(rank, world_size, plan, STEPS, "sgd", CAPTURE, None)


def _run(pool, plan) -> dict:
    return merge_ranks(pool.run(_rank, plan.world_size, plan, timeout_s=200.0))


@pytest.mark.parametrize("layout", [dict(tp=2, sp=True), dict(dp=2, tp=2, zero=3)],
                         ids=["tp2-sp", "dp2-tp2-zero3"])
def test_per_head_q_and_k_norms_under_tp_match_single_process(pool, layout):
    plan = make_plan(MODEL, mbs=2, gbs=4, **layout)
    run, ref = _run(pool, plan), _run(pool, reference_plan(plan))
    for name in NORMS:  # the norms train: a gradient the check compares
        assert ref["grads"][1][name].any(), name
    problems = compare(run, ref)
    assert not problems, "\n".join(problems[:20])


def _placements(rank: int, world_size: int) -> dict:
    from autoplan.runtime import tensor_parallel
    from autoplan.runtime.mesh import ParallelDims, build_mesh
    from autoplan.runtime.models.transformer import build_meta_model

    model = build_meta_model(MODEL, 0.0, 2)
    tensor_parallel.apply_tp(model, build_mesh(ParallelDims(tp=2), "cpu")["tp"], True, True)
    attn = model.layers["0"].attention
    return {n: (tuple(p.to_local().shape), str(p.placements[0]))
            for n, p in attn.named_parameters() if "norm" in n}


def test_tensor_parallel_keeps_the_norms_whole_on_each_rank(pool):
    hd = MODEL.head_width
    for found in pool.run(_placements, 2, timeout_s=60.0):
        assert found == {"q_norm.weight": ((hd,), "R"), "k_norm.weight": ((hd,), "R")}
