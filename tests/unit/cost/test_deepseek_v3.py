"""What DeepSeek-V3's report (arXiv 2412.19437) says, priced: its fine-grained FP8 GEMMs
(fp8_gemm_efficiency from the DeepGEMM README), its multi-token-prediction module (§2.2) and its
recompute (§3.2.3, §3.3.3: runtimes.SelectiveKind.DEEPSEEK_V3)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost import (
    activations,
    block_time,
    compute,
    latent_attention,
    memory,
    mtp,
    params,
    step_memory,
    step_time,
)
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import RUNTIMES, SelectiveKind, load_runtime
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import PRESETS, ModelSpec, load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision, plan_from_dict
from autoplan.plan_files import plan_to_dict
from autoplan.plan_rules import runtime_limits
from autoplan.plan_table import plan_to_row
from tests.unit.cost.test_moe import ACCURACY, DEEPSEEK_RUNTIME, DEEPSEEK_STEP_S
from tests.unit.test_moe_spec import DEEPSEEK_V3

DS = PRESETS["deepseek-v3"]
H800 = ClusterSpec(load_profile("h800-sxm-80gb"), 2048)


def _deepgemm():
    return ACCURACY._bench_module("deepgemm_fp8")


def test_fp8_gemm_efficiency_is_the_deepgemm_tables_and_loads_strictly(tmp_path):
    """The traits file holds the internal CUTLASS kernels' factor as derived from DeepGEMM's
    table (TFLOPS / stated speed-up); DeepGEMM's own is faster; both below the curve."""
    dg = _deepgemm()
    traits = load_runtime(DEEPSEEK_RUNTIME)
    assert traits.fp8_gemm_efficiency == round(dg.fp8_gemm_efficiency(internal=True), 3)
    assert dg.fp8_gemm_efficiency(internal=True) < dg.fp8_gemm_efficiency() < 1.0
    # the README rounds speed-ups to 0.1x: the factor is known to a range around the point,
    # slower internal kernels (a larger speed-up) at its low end; DeepGEMM's own outside it
    low = dg.fp8_gemm_efficiency(internal=True, speedup_shift=dg.SPEEDUP_ROUNDING)
    high = dg.fp8_gemm_efficiency(internal=True, speedup_shift=-dg.SPEEDUP_ROUNDING)
    assert low < traits.fp8_gemm_efficiency < high < dg.fp8_gemm_efficiency()
    assert 0.03 < high - low < 0.1
    # the grouped rows are EP 64's own shape: 4 experts of 8192 tokens on each rank
    assert DS.moe.num_experts // 64 == 4 and 4096 * DS.moe.experts_per_token // 4 == 8192
    for bad in ("1.7", "0.0", "true", "fast"):
        path = tmp_path / "bad.yaml"
        path.write_text(f"schema_version: 1\nname: x\nfp8_gemm_efficiency: {bad}\n")
        with pytest.raises(ConfigError, match="fp8_gemm_efficiency"):
            load_runtime(str(path))


def test_fp8_factor_prices_fp8_gemms_only():
    plan = ACCURACY.deepseek_v3_plan()
    traits = load_runtime(DEEPSEEK_RUNTIME)
    slow = replace(traits, fp8_gemm_efficiency=0.5)
    fast = estimate_plan(plan, H800, runtime=replace(traits, fp8_gemm_efficiency=1.0))
    assert estimate_plan(plan, H800, runtime=slow).time["compute"] > fast.time["compute"]
    bf16 = replace(plan, precision=Precision.BF16)
    assert estimate_plan(bf16, H800, runtime=slow).time == estimate_plan(
        bf16, H800, runtime=traits).time


def test_expert_and_mla_gemms_run_at_the_fp8_peak():
    """An fp8 block can be at most twice as fast as its bf16 twin (the fp8 peak is twice the
    bf16 one, attention stays bf16): pricing the MoE/MLA part at the bf16 peak while the block
    it corrects ran at fp8 made DeepSeek-V3's fp8 compute 0.43 of its bf16 compute."""
    model = DS.replace(mtp_layers=0)  # the middle stages set the step, not the loss stage
    traits = replace(load_runtime(DEEPSEEK_RUNTIME), fp8_gemm_efficiency=1.0)
    plan = ACCURACY.deepseek_v3_plan()
    fp8 = estimate_plan(plan, H800, model=model, runtime=traits).time["compute"]
    bf16 = estimate_plan(replace(plan, precision=Precision.BF16), H800, model=model,
                         runtime=traits).time["compute"]
    assert 0.5 < fp8 / bf16 < 1.0


def test_mtp_parameters_apart_from_the_main_model():
    """README_WEIGHTS.md: 671B main model, MTP 11.5B unique besides the shared 0.9B embedding
    and 0.9B head; README: 685B on Hugging Face in all (the checkpoint stores the MTP's
    embedding and head again). Its "14B" (685 - 671, rounded) is 13.5B counted this way."""
    assert DS.mtp_layers == 1
    assert params.total_params(DS) == pytest.approx(671e9, rel=0.01)
    assert params.mtp_params(DS) == pytest.approx(11.5e9, rel=0.01)
    copies = 2 * DS.vocab_size * DS.hidden_size
    assert params.total_params(DS) + params.mtp_params(DS) + copies == pytest.approx(685e9,
                                                                                   rel=0.01)
    rest, experts = params.mtp_block_params(DS)
    # one MoE block (layer 61 >= first_k_dense_replace 3) + eh_proj 2h x h + two RMSNorms
    assert experts == 256 * params.expert_params(DS)
    assert rest == params.attention_params(DS) + 2 * 7168 + params.router_params(DS) \
        + params.expert_params(DS) + 2 * 7168 * 7168 + 2 * 7168
    assert params.mtp_params(DS.replace(mtp_layers=0)) == 0


def test_mtp_is_imported_from_the_hf_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DEEPSEEK_V3, "num_nextn_predict_layers": 1}))
    assert load_model(str(path)).mtp_layers == 1
    path.write_text(json.dumps(DEEPSEEK_V3))
    assert load_model(str(path)).mtp_layers == 0
    path.write_text(json.dumps({**DEEPSEEK_V3, "num_nextn_predict_layers": -1}))
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        load_model(str(path))
    with pytest.raises(ConfigError, match="mtp_layers"):
        ModelSpec(name="x", num_layers=2, hidden_size=8, num_heads=2, vocab_size=16, seq_len=8,
                  mtp_layers=3)


def test_plans_without_mtp_read_as_before_and_with_it_round_trip():
    tiny = PRESETS["tiny-llama"]
    plan = Plan(model=tiny, cluster=ClusterRef("cpu-gloo", 1), batch=Batch(1, 4))
    assert "mtp_layers" not in plan_to_dict(plan)["model"]
    with_mtp = replace(plan, model=tiny.replace(mtp_layers=1))
    data = plan_to_dict(with_mtp)
    assert data["model"]["mtp_layers"] == 1
    assert plan_from_dict(data).model_spec().mtp_layers == 1


def test_autoplan_train_refuses_mtp_in_one_line():
    from autoplan.runtime.validation import check_plan

    plan = Plan(model=PRESETS["tiny-llama"].replace(mtp_layers=1),
                cluster=ClusterRef("cpu-gloo", 1), batch=Batch(1, 4))
    why = runtime_limits(plan, plan.model_spec())
    assert len(why) == 1 and "mtp_layers=1" in why[0] and "\n" not in why[0]
    with pytest.raises(ConfigError, match="multi-token-prediction"):
        check_plan(plan, plan.model_spec(), world_size=1)
    plain = replace(plan, model=PRESETS["tiny-llama"])
    assert runtime_limits(plain, plain.model_spec()) == []
    check_plan(plain, plain.model_spec(), world_size=1)


def test_mtp_adds_its_block_projection_and_head_to_the_loss_stage():
    """Dense, one stage: one MTP depth costs exactly one more block, eh_proj (fwd + bwd) and a
    second output layer with its cross-entropy."""
    base = PRESETS["llama-3-8b"]
    plan = Plan(model=base, cluster=ClusterRef("h100-sxm-80gb", 8), parallel=Parallel(dp=8),
                batch=Batch(micro_batch_size=1, global_batch_size=64), zero_stage=1)
    traits = load_runtime("megatron")

    def compute_s(model):
        return estimate_plan(plan, model=model, runtime=traits).time["compute"]

    extra = compute_s(base.replace(mtp_layers=1)) - compute_s(base.replace(num_layers=33))
    profile = step_time.priced_profile(load_profile("h100-sxm-80gb"), traits)
    r = rows_of(plan_to_row(plan, base), base, "bf16", traits)
    peak = profile.device.peak("bf16")
    tokens, h = np.array(8192.0), base.hidden_size
    proj = compute.gemm_time_s(2 * tokens * 2 * h * h, profile, peak, (tokens, np.array(h)))
    head = compute.logits_times_s(base, profile, peak, r.b, r.tp, r.cp, r.vocab,
                                  traits.loss_bytes("bf16"))
    m = 64 / 8
    assert extra == pytest.approx(float(m * (3 * proj + head)[0]), rel=1e-6)


def test_mtp_memory_sits_on_the_loss_stage():
    plan = ACCURACY.deepseek_v3_plan()
    traits = load_runtime(DEEPSEEK_RUNTIME)
    r = rows_of(plan_to_row(plan, DS), DS, "fp8", traits)
    rest, experts = mtp.params_per_rank(DS, r.tp, r.ep, r.etp)
    whole = params.mtp_block_params(DS)
    assert float(experts[0]) == whole[1] / 64 and float(rest[0]) == whole[0]  # tp 1
    # the loss stage's states grow by the module's parameters (fp8: weights 2, fp32 grads 4,
    # sharded optimizer 12 / dp), its activations by one more block and a second saved softmax
    with_mtp = step_memory._stage_states(DS, r, "fp8", traits)[1]
    without = step_memory._stage_states(DS.replace(mtp_layers=0), r, "fp8", traits)[1]
    grew = with_mtp["params"] - without["params"]
    assert float(grew[0]) == pytest.approx(float((rest + experts)[0]) * (
        2.0 + traits.fp8_weight_cache_bytes), rel=1e-9)


def test_deepseek_recompute_keeps_what_the_report_keeps():
    """§3.2.3: norms and MLA up-projections re-run; §3.3.3 (2): SwiGLU's input kept in FP8,
    its output re-run. Kept = everything - norm outputs - Q/K/V - SwiGLU output - half the
    SwiGLU input + the MLA latents; it fits the published plan on 80 GiB."""
    traits = load_runtime(DEEPSEEK_RUNTIME)
    assert traits.selective is SelectiveKind.DEEPSEEK_V3
    plan = ACCURACY.deepseek_v3_plan()
    r = rows_of(plan_to_row(plan, DS), DS, "fp8", traits)
    parts = step_memory.activation_parts(DS, r, False, traits, "fp8")
    none = activations.activation_bytes_per_layer(parts, np.array([0]), "fp8")
    kept = activations.activation_bytes_per_layer(parts, np.array([1]), "fp8", "deepseek-v3")
    dense_in = parts["gemm_in"] - parts["gemm_in_routed"]
    want = none - dense_in - parts["qkv"] - parts["mlp_mid"] - 0.5 * parts["mlp_act"] \
        + latent_attention.mla_latent_bytes(DS, r)
    assert float(kept[0]) == pytest.approx(float(want[0]), rel=1e-12)
    assert float(parts["input"][0]) < float(kept[0]) < float(none[0])
    est = estimate_plan(plan, H800, runtime=traits)
    full = estimate_plan(ACCURACY.deepseek_v3_plan("full"), H800, runtime=traits)
    assert est.feasible and est.memory["total"] <= 80 * 2**30
    assert 0.0 < est.time["recompute"] < 0.25 * full.time["recompute"]
    assert est.step_time_s < full.step_time_s < DEEPSEEK_STEP_S * 1.2


def _dense_pipeline_plan(layers: tuple[int, ...] | None = None) -> Plan:
    from autoplan.plan import Pipeline

    return Plan(model="llama-3-70b", cluster=ClusterRef("h100-sxm-80gb", 64),
                parallel=Parallel(dp=1, tp=8, pp=8), sequence_parallel=True,
                pipeline=Pipeline(layers_per_stage=layers),
                batch=Batch(micro_batch_size=1, global_batch_size=64), zero_stage=1)


def test_dualpipe_pairs_the_end_stages():
    """Rank 0 holds the first and last stages: moving a block from one end to the other leaves
    its time unchanged (the pair runs at the mean of its stages), while 1F1B's slowest stage
    moves. Memory is not symmetric: rank 0 holds pp micro-batches of the first stage and one
    of the last (tests/unit/cost/test_dualpipe.py)."""
    traits = replace(load_runtime("megatron"), dualpipe=True)
    a = estimate_plan(_dense_pipeline_plan((9, *[10] * 6, 11)), runtime=traits)
    b = estimate_plan(_dense_pipeline_plan((11, *[10] * 6, 9)), runtime=traits)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-6)
    one_a = estimate_plan(_dense_pipeline_plan((9, *[10] * 6, 11)), runtime="megatron")
    one_b = estimate_plan(_dense_pipeline_plan((11, *[10] * 6, 9)), runtime="megatron")
    assert one_a.step_time_s != pytest.approx(one_b.step_time_s, rel=1e-3)
    # two stages' parameters on a rank: twice the middle stage's
    assert a.memory["params"] > 1.8 * one_a.memory["params"]
    # a pricing of DeepSeek's own runtime only: no preset runs it
    assert not any(load_runtime(name).dualpipe for name in RUNTIMES)


def test_dualpipe_trait_loads_strictly(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("schema_version: 1\nname: x\ndualpipe: 1\n")
    with pytest.raises(ConfigError, match="dualpipe"):
        load_runtime(str(path))
    assert load_runtime(DEEPSEEK_RUNTIME).dualpipe


def test_mtp_loss_stage_keeps_an_embedding_copy_apart_from_stage_0():
    """Megatron-Core builds the embedding on the MTP stage too (gpt_model.py: `if
    self.pre_process or self.mtp_process`) and all-reduces its gradient with stage 0's
    (finalize_model_grads: `share_embeddings_and_output_weights or mtp_num_layers`); DualPipe
    puts both on rank 0 and keeps one (report §3.2.3)."""
    plan = ACCURACY.deepseek_v3_plan(layers=ACCURACY.ONE_F_ONE_B_LAYERS)
    one = ACCURACY.one_f_one_b_runtime()
    dual = load_runtime(DEEPSEEK_RUNTIME)
    row = plan_to_row(plan, DS)
    last = {}
    for name, traits in (("1f1b", one), ("dual", dual)):
        r = rows_of(row, DS, "fp8", traits)
        last[name] = step_memory._stage_states(DS, r, "fp8", traits)[1]
        copy = float(step_memory.mtp_embedding_copy(DS, r, traits)[0])
        assert copy == (DS.vocab_size * DS.hidden_size if name == "1f1b" else 0.0)
    r = rows_of(row, DS, "fp8", one)
    want = memory.model_state_bytes(
        np.array([float(DS.vocab_size * DS.hidden_size)]), r.zero, r.shard, "fp8",
        r.offload_optimizer, r.offload_params, grad_bytes=one.grad_bytes("fp8"),
        unsharded_accumulation=r.unsharded_accumulation,
        fp32_sharded_params=one.fp32_sharded_params, fsdp2_offload=one.fsdp2_offload)
    want["params"] = want["params"] + DS.vocab_size * DS.hidden_size * one.fp8_weight_cache_bytes
    no_mtp = DS.replace(mtp_layers=0)
    r0 = rows_of(plan_to_row(plan, no_mtp), no_mtp, "fp8", one)
    base = step_memory._stage_states(no_mtp, r0, "fp8", one)[1]
    mtp_only = step_memory._stage_states(
        DS, r, "fp8", replace(one, dualpipe=True))[1]  # MTP block without the copy
    for k in ("params", "grads", "optimizer"):
        assert float(last["1f1b"][k][0] - mtp_only[k][0]) == pytest.approx(
            float(want[k][0]), rel=1e-9)
        assert float(mtp_only[k][0]) > float(base[k][0])
    # its gradient all-reduce between the first and the last stage, none without MTP
    with_mtp = estimate_plan(plan, H800, runtime=one)
    without = estimate_plan(plan, H800, runtime=one, model=no_mtp)
    assert with_mtp.time["pp_comm"] > without.time["pp_comm"]
    dual_est = estimate_plan(ACCURACY.deepseek_v3_plan(), H800, runtime=dual)
    dual_no = estimate_plan(ACCURACY.deepseek_v3_plan(), H800, runtime=dual, model=no_mtp)
    assert dual_est.time["pp_comm"] == pytest.approx(dual_no.time["pp_comm"], rel=1e-12)


def test_deepseek_recompute_re_runs_no_routed_copies():
    """The dispatched copies (gemm_in_routed) are kept, not re-made: their bytes weigh in the
    re-run share as any other kept part (the attention output here) does, not as norm
    outputs. And the up projections' FLOPs are MLA's GEMMs' (latent_attention._mla_gemms), once."""
    traits = load_runtime(DEEPSEEK_RUNTIME)
    r = rows_of(plan_to_row(ACCURACY.deepseek_v3_plan(), DS), DS, "fp8", traits)
    parts = step_memory.activation_parts(DS, r, False, traits, "fp8")
    prof = step_time.priced_profile(H800.profile, traits)
    peak = block_time.gemm_peak(prof, "fp8", traits)
    lt = block_time.block_times_s(DS, prof, "fp8", r.b, r.tp, r.cp, False, traits, parts, r.sp)
    routed = parts["gemm_in_routed"]
    moved = {**parts, "gemm_in": parts["gemm_in"] - routed, "gemm_in_routed": 0.0 * routed,
             "attn_out": parts["attn_out"] + routed}
    from autoplan.cost.recompute_time import deepseek_v3_recompute_s, recompute_flops_per_step

    a = deepseek_v3_recompute_s(DS, prof, peak, r, lt, parts)
    b = deepseek_v3_recompute_s(DS, prof, peak, r, lt, moved)
    assert float(routed[0]) > 0.0 and float(a[0]) == pytest.approx(float(b[0]), rel=1e-12)
    mla = DS.mla
    up = 2.0 * DS.seq_len * DS.num_heads * (mla.q_lora_rank * mla.qk_head_dim + mla.kv_lora_rank
                                            * (mla.qk_nope_head_dim + mla.v_head_dim))
    got = latent_attention.mla_up_flops(DS, np.array(float(DS.seq_len)), np.array(1.0))
    assert float(got) == pytest.approx(up, rel=1e-12)
    per_step = recompute_flops_per_step(DS, r, traits)
    assert float(per_step[0]) == pytest.approx(float(r.gbs[0]) * DS.num_layers * up, rel=1e-9)
