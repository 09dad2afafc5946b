"""Recompute by module and the uniform method in the cost model: each module's memory/time
pair, uniform's group inputs, and the search table pricing them as one plan is priced."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoplan.commands import build_parser
from autoplan.cost import activations
from autoplan.cost.estimate import estimate_plan
from autoplan.model_spec import PRESETS
from autoplan.plan import (
    Batch,
    ClusterRef,
    Parallel,
    Plan,
    Recompute,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
)
from autoplan.plan_rules import validate_plan
from autoplan.plan_table import RC_UNIFORM, modules_mask
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.ranking import recompute_names, row_plan
from autoplan.search.space import recompute_pairs
from autoplan.search_space import load_space

M = RecomputeModule
SEL, FULL = RecomputePolicy.SELECTIVE, RecomputePolicy.FULL
GPT = PRESETS["gpt3-175b"]


def _parts(model=GPT, b=1, tp=8, sp=True):
    return activations.activation_elements_per_layer(model, np.array(b), np.array(tp),
                                                     np.array(sp), np.array(1),
                                                     eager_attention=False)


def test_module_figures_term_by_term():
    """GPT-3 175B, tp 8 with sequence parallelism (everything split by t), 16-bit, fused
    kernels: per layer the block keeps 2sbh/t x (2 norm inputs + 2 GEMM inputs + 1 mask +
    3 QKV + 1 attention output + 4 + 4 MLP) + 4asb/t of row statistics (Korthikanti et al.
    2022, 34sbh/t with dropout); core_attn frees the 4asb/t, mlp the 16sbh/t of the two MLP
    tensors (2sbf/t each, f = 4h), layernorm the 4sbh/t of the two norm outputs."""
    s, b, h, a, t = GPT.seq_len, 1, GPT.hidden_size, GPT.num_heads, 8
    sbh_t = s * b * h / t
    p = _parts()
    none = activations.activation_bytes_per_layer(p, np.array(0), "bf16")
    assert float(none) == pytest.approx(34 * sbh_t + 4 * a * s * b / t)

    def drop(*ms):
        mask = sum({M.CORE_ATTN: 1, M.MLP: 2, M.LAYERNORM: 4}[m] for m in ms)
        return float(none - activations.activation_bytes_per_layer(p, np.array(1), "bf16",
                                                                   modules=np.array(mask)))

    assert drop(M.CORE_ATTN) == pytest.approx(4 * a * s * b / t)
    assert drop(M.MLP) == pytest.approx(16 * sbh_t)
    assert drop(M.LAYERNORM) == pytest.approx(4 * sbh_t)
    assert drop(M.CORE_ATTN, M.MLP, M.LAYERNORM) == pytest.approx(
        drop(M.CORE_ATTN) + drop(M.MLP) + drop(M.LAYERNORM))


def _plan(rc: Recompute, **kw) -> Plan:
    kw.setdefault("parallel", Parallel(dp=8, tp=8, pp=16))
    return Plan(model="gpt3-175b", cluster=ClusterRef("a100-sxm4-80gb", 1024),
                batch=Batch(1, 1536), sequence_parallel=True, zero_stage=1, recompute=rc, **kw)


@pytest.mark.parametrize("runtime", ["megatron", None])
def test_each_module_trades_memory_for_time(runtime):
    """Against no recompute, every module set keeps less and recomputes more; the MLP costs
    its two GEMMs again (far more than the attention core or the norms)."""
    none = estimate_plan(_plan(Recompute()), runtime=runtime)
    est = {ms: estimate_plan(_plan(Recompute(policy=SEL, modules=ms)), runtime=runtime)
           for ms in ((M.CORE_ATTN,), (M.MLP,), (M.LAYERNORM,))}
    for e in est.values():
        assert e.memory["activations"] < none.memory["activations"]
        assert e.time["recompute"] > 0
    assert est[(M.MLP,)].time["recompute"] > 10 * est[(M.CORE_ATTN,)].time["recompute"]
    assert est[(M.MLP,)].time["recompute"] > 10 * est[(M.LAYERNORM,)].time["recompute"]


def test_uniform_keeps_one_input_per_group_and_recomputes_every_layer():
    """6 layers per stage: uniform by 3 keeps 2 inputs per micro-batch in flight where
    block-full keeps 6, re-makes 3 layers at once in backward, and recomputes all 6 like
    block-full; uniform by 1 is block-full."""
    full = estimate_plan(_plan(Recompute(policy=FULL)))
    uni = {k: estimate_plan(_plan(Recompute(policy=FULL, num_layers=k,
                                            method=RecomputeMethod.UNIFORM)))
           for k in (1, 3)}
    assert uni[1].memory["activations"] == pytest.approx(full.memory["activations"])
    assert uni[3].time["recompute"] == pytest.approx(full.time["recompute"])
    p = _parts()
    one_input = float(p["input"])
    a_none = float(activations.activation_bytes_per_layer(p, np.array(0), "bf16"))
    in_flight = 16  # 1F1B: stage 0 holds pp micro-batches
    expected = (in_flight * (2 - 6) * one_input  # 2 group inputs instead of 6 layer inputs
                + (3 - 1) * (a_none - one_input))  # 3 layers re-made at once instead of 1
    assert uni[3].memory["activations"] - full.memory["activations"] == pytest.approx(
        expected, rel=1e-9)


def test_search_table_prices_modules_and_uniform_as_one_plan_is_priced():
    """The opt-in space's rows with modules or uniform, made into plans, estimate to the same
    step time and memory the search table gave them."""
    argv = ["search", "--model", "llama-3-8b", "--cluster", "a100-sxm4-40gb", "--num-gpus",
            "8", "--global-batch-size", "64", "--space", "recompute-modules"]
    req = build_request(build_parser().parse_args(argv))
    result = run_search(req)
    c = result.scored.cols
    order = [int(i) for i in result.order]
    picks = [next(i for i in order if c["rc_modules"][i] == mask) for mask in (1, 4, 5)]
    picks.append(next(i for i in order if c["rc_method"][i] == RC_UNIFORM))
    names = recompute_names(c, np.array(picks))  # as the tables show them (no rich markup)
    assert list(names) == ["selective(core_attn)", "selective(layernorm)",
                           "selective(core_attn+layernorm)", "full-uniform"]
    space = load_space("recompute-modules").for_device({"bf16": 1.0}, cpu=False).for_runtime(
        [True])  # as the search settled it: autoplan's runtime runs SDPA's fused kernel
    for i in picks:
        plan = row_plan(result.scored, i, req.model, "llama-3-8b", "a100-sxm4-40gb", space,
                        req.targets)
        assert plan.recompute.modules or plan.recompute.method == RecomputeMethod.UNIFORM
        assert validate_plan(plan, req.model) == []
        est = estimate_plan(plan.replace(predicted=None))
        assert est.time["step"] == pytest.approx(float(c["time_step"][i]), rel=1e-9)
        assert est.memory["total"] == pytest.approx(float(c["mem_total"][i]), rel=1e-9)


def test_default_space_is_unchanged_and_the_opt_in_space_adds_the_choices():
    """The default space tries neither (9 recompute choices: none, 4 selective, 4 full); the
    opt-in space recompute-modules tries 6 module sets for each selective count and the uniform
    method for each non-null full count (1 + 24 + 7 = 32), the two MoE sets on MoE models
    only (1 + 16 + 7 = 24 on a dense one)."""
    default, opt_in = load_space("default"), load_space("recompute-modules")
    assert default.recompute.modules == (None,)
    assert default.recompute.method == (RecomputeMethod.BLOCK,)
    assert default.knob_sizes()["recompute"] == 9 and opt_in.knob_sizes()["recompute"] == 32
    assert opt_in.size() * 9 == default.size() * 32
    dense, moe = (recompute_pairs(opt_in, PRESETS[m]) for m in ("llama-3-8b", "qwen3-30b-a3b"))
    assert (len(dense), len(moe)) == (24, 32)
    moe_bits = activations.MOE | activations.MOE_ACT
    assert not any(mask & moe_bits for _, _, mask, _ in dense)
    assert {mask for _, _, mask, _ in moe if mask & moe_bits} == {
        modules_mask((M.LAYERNORM, M.MOE_ACT)), modules_mask((M.LAYERNORM, M.MOE))}
    assert len(recompute_pairs(default, PRESETS["qwen3-30b-a3b"])) == 9
    same = dataclasses.replace(opt_in, name=default.name, description=default.description,
                               recompute=default.recompute)
    assert same == default  # everything but recompute is the default space's
    assert "modules" not in default.summary()["recompute"]  # stored studies still resume


def _gpt_oss(rc: Recompute) -> Plan:
    """Megatron-Bridge's gpt-oss-120b layout on 64 H100s (micro-batch 1)."""
    return Plan(model="gpt-oss-120b", cluster=ClusterRef("h100-sxm-80gb", 64),
                parallel=Parallel(dp=16, pp=4, ep=8), batch=Batch(1, 1280), zero_stage=1,
                recompute=rc)


def test_moe_modules_free_what_megatron_core_frees():
    """gpt-oss-120b (every block MoE, 4 of 128 experts of 2880, fused SwiGLU): moe_act frees
    each routed copy's activation output, 2 bytes x f_e per copy per block; mlp frees nothing
    (Megatron-Core checkpoints no MoE block under mlp); layernorm frees the norms' outputs
    but not the dispatch's copies; each costs recompute time but for mlp."""
    est = {ms: estimate_plan(_gpt_oss(Recompute(policy=SEL, modules=ms)), runtime="megatron")
           for ms in ((M.MOE_ACT,), (M.MLP,), (M.LAYERNORM,), (M.LAYERNORM, M.MOE_ACT))}
    none = estimate_plan(_gpt_oss(Recompute()), runtime="megatron")
    model = PRESETS["gpt-oss-120b"]
    drop = none.memory["activations"] - est[(M.MOE_ACT,)].memory["activations"]
    norm_drop = none.memory["activations"] - est[(M.LAYERNORM,)].memory["activations"]
    # per token and block: k copies x f_e (16-bit) against the two norm outputs of h (16-bit);
    # the block count in flight is the same for both
    k, f_e, h = model.moe.experts_per_token, model.moe.expert_ffn_hidden_size, model.hidden_size
    assert drop > 0 and drop / norm_drop == pytest.approx(k * f_e * 2 / (2 * h * 2), rel=1e-9)
    assert est[(M.MLP,)].memory["activations"] == pytest.approx(none.memory["activations"])
    assert est[(M.MLP,)].time["recompute"] == 0.0
    both = none.memory["activations"] - est[(M.LAYERNORM, M.MOE_ACT)].memory["activations"]
    assert both == pytest.approx(drop + norm_drop, rel=1e-9)
    for ms in ((M.MOE_ACT,), (M.LAYERNORM,)):
        assert est[ms].time["recompute"] > 0 and est[ms].feasible


def test_moe_act_needs_experts_and_a_runtime_that_names_it():
    dense = _plan(Recompute(policy=SEL, modules=(M.MOE_ACT,)))
    [why] = validate_plan(dense, dense.model_spec())
    assert "moe_act" in why and "gpt3-175b" in why
    refused = estimate_plan(_gpt_oss(Recompute(policy=SEL, modules=(M.MOE_ACT,))),
                            runtime="torchtitan")
    assert not refused.feasible
    assert any("cannot recompute moe_act by module" in r for r in refused.reasons)
    assert any(r.startswith("runtime megatron-2022 cannot recompute core_attn") for r in
               estimate_plan(_gpt_oss(Recompute(policy=SEL, modules=(M.CORE_ATTN,))),
                             runtime="megatron-2022").reasons)


def test_moe_frees_the_whole_moe_layer_and_re_runs_it():
    """moe (Megatron-Core's MoELayer under tensor_parallel.checkpoint) frees what the MoE
    layer keeps beyond its input: each routed copy's dispatched input (2h bytes) and expert
    MLP tensors (fused SwiGLU: fc1's 2 x f_e and the activation's f_e outputs, 2 bytes each),
    per copy per block. In time it re-runs the layer's forward GEMMs and, with ep > 1, its
    dispatch and combine: more recompute than moe_act, and more expert all-to-all than none.
    Without a pipeline (one stage holds every block, so no other stage becomes the largest)."""
    def plan(rc: Recompute) -> Plan:
        return dataclasses.replace(_gpt_oss(rc), parallel=Parallel(dp=64, ep=8))

    none = estimate_plan(plan(Recompute()), runtime="megatron")
    est = {ms: estimate_plan(plan(Recompute(policy=SEL, modules=ms)), runtime="megatron")
           for ms in ((M.MOE,), (M.MOE_ACT,), (M.LAYERNORM,), (M.LAYERNORM, M.MOE))}
    model = PRESETS["gpt-oss-120b"]
    f_e, h = model.moe.expert_ffn_hidden_size, model.hidden_size
    act_drop = none.memory["activations"] - est[(M.MOE_ACT,)].memory["activations"]
    moe_drop = none.memory["activations"] - est[(M.MOE,)].memory["activations"]
    # 16-bit bytes per copy: moe_act frees the activation's f_e, moe the dispatched h, fc1's
    # 2 f_e and the activation's f_e
    assert moe_drop / act_drop == pytest.approx((h + 3 * f_e) / f_e, rel=1e-9)
    norm_drop = none.memory["activations"] - est[(M.LAYERNORM,)].memory["activations"]
    both = none.memory["activations"] - est[(M.LAYERNORM, M.MOE)].memory["activations"]
    assert both == pytest.approx(moe_drop + norm_drop, rel=1e-9)
    assert est[(M.MOE,)].time["recompute"] > 3 * est[(M.MOE_ACT,)].time["recompute"]
    assert est[(M.MOE,)].time["ep_comm"] > none.time["ep_comm"]
    assert est[(M.MOE_ACT,)].time["ep_comm"] == pytest.approx(none.time["ep_comm"])


def test_moe_needs_experts_and_goes_without_moe_act():
    dense = _plan(Recompute(policy=SEL, modules=(M.MOE,)))
    [why] = validate_plan(dense, dense.model_spec())
    assert "recompute.modules moe" in why and "gpt3-175b" in why
    both = _gpt_oss(Recompute(policy=SEL, modules=(M.MOE, M.MOE_ACT)))
    [why] = validate_plan(both, both.model_spec())
    assert "moe and moe_act" in why and "drop moe_act" in why
    refused = estimate_plan(_gpt_oss(Recompute(policy=SEL, modules=(M.MOE,))),
                            runtime="torchtitan")
    assert any("cannot recompute moe by module" in r for r in refused.reasons)
    assert estimate_plan(_gpt_oss(Recompute(policy=SEL, modules=(M.MOE,))),
                         runtime="megatron").feasible


def test_moe_search_prices_the_moe_module_sets_as_one_plan_is_priced():
    """On a MoE model the opt-in space lists [layernorm, moe_act] and [layernorm, moe] under
    Megatron-Core: its rows, made into plans, estimate to the table's step time and memory."""
    argv = ["search", "--model", "mixtral-8x7b", "--cluster", "h100-sxm-80gb", "--num-gpus",
            "16", "--global-batch-size", "64", "--space", "recompute-modules",
            "--runtime", "megatron"]
    req = build_request(build_parser().parse_args(argv))
    result = run_search(req)
    c = result.scored.cols
    order = [int(i) for i in result.order]
    masks = [modules_mask((M.LAYERNORM, M.MOE_ACT)), modules_mask((M.LAYERNORM, M.MOE))]
    picks = [next(i for i in order if c["rc_modules"][i] == mask) for mask in masks]
    assert list(recompute_names(c, np.array(picks))) == ["selective(layernorm+moe_act)",
                                                         "selective(layernorm+moe)"]
    for i in picks:
        plan = row_plan(result.scored, i, req.model, "mixtral-8x7b", "h100-sxm-80gb", req.space,
                        req.targets)
        assert validate_plan(plan, req.model) == []
        est = estimate_plan(plan.replace(predicted=None), runtime="megatron")
        assert est.time["step"] == pytest.approx(float(c["time_step"][i]), rel=1e-9)
        assert est.memory["total"] == pytest.approx(float(c["mem_total"][i]), rel=1e-9)
