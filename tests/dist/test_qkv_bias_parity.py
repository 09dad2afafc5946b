"""Q, K AND V BIASES (model.qkv_bias, Qwen2) under tensor parallelism: a two-block Qwen2-style
model at tp 2 with sequence parallelism matches one process (fp32 losses, gradients at steps 1
and 3, parameters within 1e-5, plain SGD), and each tp rank holds half of every q, k and v bias,
split by heads as the column-parallel weight's output rows (ColwiseParallel: Shard(0)).
"""

from __future__ import annotations

import math

import pytest

import autoplan.runtime.trainer  # noqa: F401  (the forked ranks inherit the import)
from autoplan.cost import params
from autoplan.model_spec import load_model
from tests.dist.parity import (
    attention_shards,
    compare,
    make_plan,
    merge_ranks,
    reference_plan,
    run_plan_rank,
)

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

MODEL = load_model("tiny-llama").replace(name="tiny-qwen2-2l", num_layers=2, qkv_bias=True)
STEPS, CAPTURE = 3, (1, 3)


def _rank(rank: int, world_size: int, plan) -> dict:
    return run_plan_rank(rank, world_size, plan, STEPS, "sgd", CAPTURE, None)


def _run(pool, plan) -> dict:
    return merge_ranks(pool.run(_rank, plan.world_size, plan, timeout_s=200.0))


def test_q_k_v_biases_under_tp_and_sp_match_single_process(pool):
    plan = make_plan(MODEL, tp=2, sp=True, mbs=2, gbs=4)
    run, ref = _run(pool, plan), _run(pool, reference_plan(plan))
    assert "layers.0.attention.wq.bias" in ref["grads"][1]  # the biases train
    assert ref["grads"][1]["layers.0.attention.wq.bias"].any()
    problems = compare(run, ref)
    assert not problems, "\n".join(problems[:20])


def test_tensor_parallel_splits_the_biases_by_heads(pool):
    local, placements = pool.run(attention_shards, 2, MODEL, timeout_s=60.0)[1]
    h, q, kv = MODEL.hidden_size, MODEL.q_width, MODEL.kv_heads * MODEL.head_width
    assert local == {"wq.weight": (q // 2, h), "wq.bias": (q // 2,),
                     "wk.weight": (kv // 2, h), "wk.bias": (kv // 2,),
                     "wv.weight": (kv // 2, h), "wv.bias": (kv // 2,),
                     "wo.weight": (h, q // 2)}
    assert all(placements[n] == "S(0)" for n in ("wq.bias", "wk.bias", "wv.bias"))
    # the cost model's per-rank block count (cost/params.py) splits them as the runtime does
    assert sum(math.prod(s) for s in local.values()) == params.attention_params(MODEL) // 2
