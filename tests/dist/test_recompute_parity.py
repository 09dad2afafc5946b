"""PARITY for module-level recompute and Megatron's uniform method: each row matches the
single-process fp32 run (losses, gradients, parameters), and recompute is bitwise neutral.

Rows cover FSDP2 (ZeRO-2/3, whose per-block hooks run inside a uniform group's checkpoint),
tensor + sequence parallelism, pipelines (1F1B, interleaved), context parallelism, and a
uniform group that does not divide the stage (4 layers in groups of 3).
"""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.plan import Recompute, RecomputeMethod, RecomputeModule, RecomputePolicy
from tests.dist.parity import compare, make_plan, reference_plan, run_parity, with_model
from tests.dist.test_parity import ADAM_PARAM_ATOL

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

M = RecomputeModule
SEL, FULL, UNIFORM = RecomputePolicy.SELECTIVE, RecomputePolicy.FULL, RecomputeMethod.UNIFORM
DENSE = (M.CORE_ATTN, M.MLP, M.LAYERNORM)
"""Every module a dense block has (moe_act is a MoE block's)."""

ROWS = {
    # name: (make_plan arguments, recompute, optimizer)
    "dp2-zero3-llama-all-modules": (dict(model="tiny-llama", dp=2, zero=3),
                                    Recompute(policy=SEL, modules=DENSE), "adamw"),
    "tp2-sp-core-mlp-sgd": (dict(model="tiny", tp=2, sp=True),
                            Recompute(policy=SEL, modules=(M.CORE_ATTN, M.MLP)), "sgd"),
    "pp2-1f1b-layernorm-mlp": (dict(model="tiny", pp=2),
                               Recompute(policy=SEL, modules=(M.LAYERNORM, M.MLP)), "adamw"),
    # the first block of each stage only (recompute.num_layers, as the cost model prices it)
    "pp2-1f1b-layernorm-mlp-first-block": (dict(model="tiny", pp=2),
                                           Recompute(policy=SEL, num_layers=1,
                                                     modules=(M.LAYERNORM, M.MLP)), "adamw"),
    "cp2-llama-core-attn-sgd": (dict(model="tiny-llama", cp=2),
                                Recompute(policy=SEL, modules=(M.CORE_ATTN,)), "sgd"),
    "dp2-zero2-uniform-2": (dict(model="tiny", dp=2, zero=2),
                            Recompute(policy=FULL, num_layers=2, method=UNIFORM), "adamw"),
    "tp2-sp-uniform-3-llama-sgd": (dict(model="tiny-llama", tp=2, sp=True),
                                   Recompute(policy=FULL, num_layers=3, method=UNIFORM), "sgd"),
    "pp2-interleaved-zero1-uniform-1": (dict(model="tiny8-gpt", pp=2, zero=1, dp=2, mbs=1,
                                             schedule="interleaved-1f1b", vpp=2),
                                        Recompute(policy=FULL, num_layers=1, method=UNIFORM),
                                        "sgd"),
}


@pytest.mark.parametrize("modules", [(M.LAYERNORM, M.MOE_ACT), (M.LAYERNORM, M.MOE)],
                         ids=["layernorm-moe_act", "layernorm-moe"])
def test_moe_modules_under_expert_parallelism_match_single_process(pool, modules):
    """tiny-moe with ep 2 over dp 2, with Megatron-Bridge's gpt-oss modules (layernorm,
    moe_act: the experts' activation is re-made from each rank's local expert weights) and the
    Megatron MoE Model Zoo's Qwen3 long-context ones (layernorm, moe: the whole MoE layer,
    its all-to-all dispatch and combine included, runs again in backward). run_parity's fixed
    token-index router, so no near-tie can route a token elsewhere."""
    base = make_plan("tiny-moe", dp=2)
    plan = with_model(dataclasses.replace(base, parallel=dataclasses.replace(base.parallel,
                                                                             ep=2)),
                      recompute=Recompute(policy=SEL, modules=modules))
    ref = run_parity(pool, reference_plan(plan), 6, "sgd", (1, 6))
    run = run_parity(pool, plan, 6, "sgd", (1, 6))
    problems = compare(run, ref, param_atol=0.0)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("name", list(ROWS))
def test_recompute_rows_match_single_process(pool, reference_cache, name):
    args, rc, optim = ROWS[name]
    plan = with_model(make_plan(**args), recompute=rc)
    key = (str(plan.model), plan.batch, optim, 10, 0.0)
    if key not in reference_cache:
        reference_cache[key] = run_parity(pool, reference_plan(plan), 10, optim)
    run = run_parity(pool, plan, 10, optim)
    atol = ADAM_PARAM_ATOL if optim == "adamw" else 0.0
    problems = compare(run, reference_cache[key], param_atol=atol)
    assert not problems, "\n".join(problems[:20])


def test_modules_and_uniform_are_bitwise_neutral_with_dropout(pool):
    """With dropout, every recompute variant gives the losses of no recompute bitwise; a
    uniform recompute that draws fresh dropout masks (the planted recompute-fresh-rng bug,
    which our checkpoints honour too) does not."""
    base = make_plan(dp=2, zero=3)
    variants = [Recompute(policy=SEL, modules=DENSE),
                Recompute(policy=FULL, num_layers=2, method=UNIFORM)]
    ref = run_parity(pool, base, 5, "sgd", capture=(1,), dropout=0.1)["losses"]
    for rc in variants:
        got = run_parity(pool, with_model(base, recompute=rc), 5, "sgd", capture=(1,),
                         dropout=0.1)["losses"]
        assert got == ref, rc
    bad = run_parity(pool, with_model(base, recompute=variants[1]), 5, "sgd", capture=(1,),
                     dropout=0.1, bug="recompute-fresh-rng")["losses"]
    assert bad != ref
