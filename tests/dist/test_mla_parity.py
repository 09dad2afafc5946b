"""MLA PARITY: tiny-mla (multi-head latent attention, models/mla.py) under tensor + sequence
parallelism matches one process (fp32 losses, gradients at steps 1 and 3, parameters within
1e-5, plain SGD); a planted bug in the shared rotary key's gradient fails the same check; the
tensor-parallel shards hold whole heads and replicate the latents.

The model is tiny-mla cut to two blocks (half the cost; each block is the same code). `-m slow`
adds TP alone, TP without a query latent, context parallelism (which gathers MLA's padded V,
models/mla.py one_width), ZeRO-3, PP, 2-D FSDP x TP, eager attention with full recompute and
selective recompute.
"""

from __future__ import annotations

import dataclasses
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

MODEL = load_model("tiny-mla").replace(name="tiny-mla-2l", num_layers=2)
NO_Q_LATENT = MODEL.replace(mla=dataclasses.replace(MODEL.mla, q_lora_rank=None))
STEPS, CAPTURE = 3, (1, 3)


def _rope_key_grad_not_summed(mp: pytest.MonkeyPatch) -> None:
    """The shared rotary key's gradient declared replicated (to_local() without Partial), the
    trap torchtitan's DeepSeek-V3 plan warns of: each tp rank keeps its own heads' share only,
    so wkv_a and everything before it train on part of their gradient."""
    from torch.distributed.tensor import DTensor

    from autoplan.runtime.models import mla

    def shared_key(k_rope):
        return k_rope.to_local() if isinstance(k_rope, DTensor) else k_rope

    mp.setattr(mla, "shared_key", shared_key)


MLA_BUGS = {"mla-rope-key-grad-not-summed": _rope_key_grad_not_summed}


def _rank(rank: int, world_size: int, bug: str | None, plan) -> dict:
    """run_plan_rank with one of MLA_BUGS planted (monkeypatched inside the forked rank)."""
    with pytest.MonkeyPatch.context() as mp:
        if bug is not None:
            MLA_BUGS[bug](mp)
        return run_plan_rank(rank, world_size, plan, STEPS, "sgd", CAPTURE, None)


def _run(pool, plan, bug: str | None = None) -> dict:
    return merge_ranks(pool.run(_rank, plan.world_size, bug, plan, timeout_s=200.0))


C = dict
ROWS = {"tp2-sp": C(tp=2, sp=True)}
SLOW_ROWS = {
    "tp2": C(tp=2),
    "tp2-no-q-latent": C(model=NO_Q_LATENT, tp=2),
    "cp2": C(cp=2),
    "dp2-zero3": C(dp=2, zero=3, mbs=1),
    "pp2": C(pp=2, mbs=1),
    "dp2tp2-sp-zero3": C(dp=2, tp=2, sp=True, zero=3, mbs=1),
    "tp2-eager-full": C(tp=2, attention="eager", recompute="full"),
    "tp2-sp-selective": C(tp=2, sp=True, recompute="selective"),
    "dp2cp2tp2-sp": C(dp=2, cp=2, tp=2, sp=True, mbs=1),
}
BUG_ROWS = {"mla-rope-key-grad-not-summed": "tp2-sp"}


def _check(pool, reference_cache, row: dict, bug: str | None = None) -> list[str]:
    row = dict(row)
    plan = make_plan(row.pop("model", MODEL), gbs=4, **{"mbs": 2, **row})
    key = ("mla", plan.model, plan.batch)
    if key not in reference_cache:
        reference_cache[key] = _run(pool, reference_plan(plan))
    return compare(_run(pool, plan, bug), reference_cache[key])


@pytest.mark.parametrize("name", list(ROWS))
def test_latent_attention_matches_single_process(pool, reference_cache, name):
    problems = _check(pool, reference_cache, ROWS[name])
    reference_cache[("mla-clean", name)] = problems
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_ROWS))
def test_latent_attention_compositions_match_single_process(pool, reference_cache, name):
    problems = _check(pool, reference_cache, SLOW_ROWS[name])
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("bug", list(BUG_ROWS))
def test_parity_catches_planted_latent_attention_bug(pool, reference_cache, bug):
    row = BUG_ROWS[bug]
    clean_key = ("mla-clean", row)
    if clean_key not in reference_cache:
        reference_cache[clean_key] = _check(pool, reference_cache, ROWS[row])
    assert not reference_cache[clean_key], "the plan must pass without the bug"
    problems = _check(pool, reference_cache, ROWS[row], bug=bug)
    assert problems, f"parity did not catch {bug}"
    assert any("wkv_a" in p for p in problems), problems[:5]  # where the bug lives


def test_tensor_parallel_shards_heads_and_replicates_latents(pool):
    """tp 2 (the model on the meta device): the up projections and wo hold half the heads, the
    down projections (with the shared rotary key) and the latent norms all of them."""
    local, placements = pool.run(attention_shards, 2, MODEL, timeout_s=60.0)[1]
    m, a, h = MODEL.mla, MODEL.num_heads, MODEL.hidden_size
    assert local == {
        "wq_a.weight": (m.q_lora_rank, h), "q_norm.weight": (m.q_lora_rank,),
        "wq_b.weight": (a // 2 * m.qk_head_dim, m.q_lora_rank),
        "wkv_a.weight": (m.kv_lora_rank + m.qk_rope_head_dim, h),
        "kv_norm.weight": (m.kv_lora_rank,),
        "wkv_b.weight": (a // 2 * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
        "wo.weight": (h, a // 2 * m.v_head_dim),
    }
    assert {n for n, p in placements.items() if p == "R"} == {
        "wq_a.weight", "q_norm.weight", "wkv_a.weight", "kv_norm.weight"}
    # the cost model's per-rank count (cost/params.py) holds the replicated part whole too
    whole = params.tp_replicated_params(MODEL)
    assert sum(math.prod(shape) for shape in local.values()) == \
        (params.mla_params(MODEL) - whole) // 2 + whole
