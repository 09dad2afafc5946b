"""ModelSpec.rope_scaling of rope_type yarn (DeepSeek-V3, gpt-oss): validation, files that hold
only their kind's fields, the presets, Hugging Face config.json reading, and the runtime's
rotation and softmax scale against torchtitan's own formulas."""

from __future__ import annotations

import json
import logging
import math

import pytest
import yaml

from autoplan.errors import ConfigError
from autoplan.model_spec import (
    DEEPSEEK_V3_ROPE_SCALING,
    GPT_OSS_ROPE_SCALING,
    PRESETS,
    RopeScaling,
    load_model,
    model_dict,
)
from autoplan.yaml_io import from_dict, to_dict

DSV3_SCALING = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
"""deepseek-ai/DeepSeek-V3 config.json rope_scaling (with "rope_theta": 10000)."""
GPT_OSS_SCALING = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                   "original_max_position_embeddings": 4096, "truncate": False}
"""openai/gpt-oss-120b config.json rope_scaling (with "rope_theta": 150000)."""
YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}


def test_presets_rotate_as_the_released_models() -> None:
    assert PRESETS["deepseek-v3"].rope_scaling == DEEPSEEK_V3_ROPE_SCALING
    assert PRESETS["gpt-oss-120b"].rope_scaling == GPT_OSS_ROPE_SCALING
    assert PRESETS["deepseek-v3"].rope_theta == 10000.0
    assert PRESETS["gpt-oss-120b"].rope_theta == 150000.0
    for name in ("tiny-mla", "tiny-deepseek", "qwen3-30b-a3b", "mixtral-8x7b"):
        assert PRESETS[name].rope_scaling is None


def test_the_two_magnitude_conventions() -> None:
    """HF transformers' _compute_yarn_parameters: attention_factor = 0.1 ln(factor) + 1 on
    cos/sin unless mscale and mscale_all_dim are both given (their ratio); DeepSeek's MLA
    multiplies the softmax scale by (0.1 mscale_all_dim ln(factor) + 1)^2 (yarn_apply_mscale)."""
    assert GPT_OSS_ROPE_SCALING.attention_scaling == pytest.approx(0.1 * math.log(32) + 1)
    assert GPT_OSS_ROPE_SCALING.softmax_gain == 1.0
    assert DEEPSEEK_V3_ROPE_SCALING.attention_scaling == 1.0
    assert DEEPSEEK_V3_ROPE_SCALING.softmax_gain == pytest.approx((0.1 * math.log(40) + 1) ** 2)
    v2_lite = RopeScaling(**YARN, mscale=0.707, mscale_all_dim=0.707)
    assert v2_lite.attention_scaling == 1.0
    assert v2_lite.softmax_gain == pytest.approx((0.0707 * math.log(40) + 1) ** 2)
    assert RopeScaling(**YARN, attention_factor=1.1).attention_scaling == 1.1
    assert RopeScaling(**YARN, mscale=0.5).attention_scaling == pytest.approx(
        0.1 * math.log(40) + 1)  # mscale alone is ignored, as HF ignores it


@pytest.mark.parametrize(("change", "field"), [
    ({"factor": 0.5}, "factor"), ({"beta_fast": 0}, "beta_fast"),
    ({"beta_fast": 1.0}, "beta_fast"),  # not above beta_slow
    ({"mscale_all_dim": math.inf}, "mscale_all_dim"),
    ({"attention_factor": -1}, "attention_factor"),
    ({"truncate": "no"}, "truncate"), ({"low_freq_factor": 1.0}, "low_freq_factor"),
    ({"factor": None}, "factor"), ({"original_max_position_embeddings": None},
                                   "original_max_position_embeddings"),
    ({"rope_type": "linear"}, "rope_type"),
])
def test_bad_yarn_is_one_line_naming_the_field(change: dict, field: str) -> None:
    data = {k: v for k, v in {**YARN, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        from_dict(RopeScaling, data, "model.rope_scaling")
    assert err.value.field == f"model.rope_scaling.{field}" and "\n" not in str(err.value)


def test_a_llama3_file_refuses_yarn_fields() -> None:
    """A YaRN block that leaves out rope_type (llama3 by default) is told to set it."""
    with pytest.raises(ConfigError, match="beta_fast: given with rope_type llama3; set "
                                          "rope_type: yarn \\(its field\\), or drop it"):
        from_dict(RopeScaling, {"factor": 40.0, "original_max_position_embeddings": 4096,
                                "beta_fast": 32.0}, "model.rope_scaling")
    with pytest.raises(ConfigError, match="low_freq_factor: given with rope_type yarn; set "
                                          "rope_type: llama3 \\(its field\\), or drop it"):
        from_dict(RopeScaling, {**YARN, "low_freq_factor": 1.0}, "model.rope_scaling")


def test_a_file_holds_only_its_kinds_fields(tmp_path) -> None:
    """A yarn model writes rope_type yarn and YaRN's fields (mscale etc. only where given), a
    llama3 one exactly what it wrote before yarn existed; both read back equal."""
    ds = model_dict(to_dict(PRESETS["deepseek-v3"]))["rope_scaling"]
    assert ds == {"factor": 40.0, "original_max_position_embeddings": 4096, "rope_type": "yarn",
                  "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                  "truncate": True}
    assert set(model_dict(to_dict(PRESETS["gpt-oss-120b"]))["rope_scaling"]) == {
        "factor", "original_max_position_embeddings", "rope_type", "beta_fast", "beta_slow",
        "truncate"}
    assert model_dict(to_dict(PRESETS["llama-3.1-8b"]))["rope_scaling"] == {
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    for name in ("deepseek-v3", "gpt-oss-120b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(model_dict(to_dict(PRESETS[name]))))
        assert load_model(str(path)) == PRESETS[name]


def test_a_plan_file_of_a_yarn_model_reloads_equal(tmp_path) -> None:
    from autoplan.plan import Batch, ClusterRef, Parallel, Plan
    from autoplan.plan_files import load_plan, save_plan

    plan = Plan(model=PRESETS["gpt-oss-120b"].replace(name="oss-inline"),
                cluster=ClusterRef("h100-sxm-80gb", 8), parallel=Parallel(dp=8),
                batch=Batch(micro_batch_size=1, global_batch_size=8))
    path = save_plan(plan, tmp_path / "plan.yaml")
    assert "low_freq_factor" not in path.read_text() and "truncate: false" in path.read_text()
    assert load_plan(path) == plan


def test_yarn_needs_a_base_above_one() -> None:
    with pytest.raises(ConfigError, match="model.rope_theta: 1 with rope_scaling yarn"):
        PRESETS["tiny-llama"].replace(rope_theta=1.0, rope_scaling=GPT_OSS_ROPE_SCALING)


LLAMA_CFG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
             "vocab_size": 256, "max_position_embeddings": 131072, "rope_theta": 10000.0}


def _read(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


def test_hf_yarn_is_read_in_each_spelling(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf_values"):
        ds = _read(tmp_path, {**LLAMA_CFG, "rope_scaling": DSV3_SCALING})  # the older "type"
        oss = _read(tmp_path, {**LLAMA_CFG, "rope_theta": 150000.0,
                               "rope_scaling": GPT_OSS_SCALING})
        new = {k: v for k, v in LLAMA_CFG.items() if k != "rope_theta"}  # transformers 5
        v5 = _read(tmp_path, {**new, "rope_parameters": {**GPT_OSS_SCALING,
                                                         "rope_theta": 150000.0}})
    assert "not modelled" not in caplog.text
    assert ds.rope_scaling == DEEPSEEK_V3_ROPE_SCALING and ds.seq_len == 4096
    assert oss.rope_scaling == GPT_OSS_ROPE_SCALING == v5.rope_scaling
    assert v5.rope_theta == 150000.0


def test_hf_yarn_reads_as_transformers_does(tmp_path) -> None:
    """The original window defaults to max_position_embeddings (standardize_rope_params), betas
    to 32 and 1, truncate to true, and an mscale of 0 is none (`if mscale and
    mscale_all_dim`)."""
    spec = _read(tmp_path, {**LLAMA_CFG, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "mscale": 0, "mscale_all_dim": 0}})
    assert spec.rope_scaling == RopeScaling(rope_type="yarn", factor=4.0,
                                            original_max_position_embeddings=131072)
    assert spec.rope_scaling.beta_fast == 32.0 and spec.rope_scaling.truncate is True


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "original_max_position_embeddings": 4096},
    {**GPT_OSS_SCALING, "beta_slow": 64.0},
    {**GPT_OSS_SCALING, "truncate": "false"},
])
def test_hf_bad_yarn_names_the_file_and_key(tmp_path, scaling) -> None:
    with pytest.raises(ConfigError) as err:
        _read(tmp_path, {**LLAMA_CFG, "rope_scaling": scaling})
    assert "config.json rope_scaling" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["linear", "dynamic", "longrope"])
def test_hf_other_kinds_still_warn(tmp_path, caplog, kind) -> None:
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf_values"):
        spec = _read(tmp_path, {**LLAMA_CFG, "rope_scaling": {"rope_type": kind,
                                                               "factor": 4.0}})
    assert spec.rope_scaling is None
    assert f"rope_type '{kind}' is not modelled" in caplog.text


torch = pytest.importorskip("torch")
CPU = torch.device("cpu")


def _torchtitan_yarn(dim: int, base: float, factor: float, beta_fast: float, beta_slow: float,
                     original: int, truncate: bool) -> torch.Tensor:
    """torchtitan's YaRN frequencies, copied: 0.2.2 torchtitan/models/deepseek_v3/model/
    model.py precompute_freqs_cis (find_correction_dim, find_correction_range: floor/ceil,
    clamped to [0, dim - 1]; linear_ramp_factor; freqs / factor * (1 - smooth) + freqs * smooth
    with smooth = 1 - ramp), 0.3.0 torchtitan/models/common/rope.py _yarn_inv_freq (the same,
    floor/ceil only with truncate)."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))

    def find_correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    smooth = 1 - ramp
    return freqs / factor * (1 - smooth) + freqs * smooth


@pytest.mark.parametrize(("name", "dim"), [("deepseek-v3", 64), ("gpt-oss-120b", 64)])
def test_runtime_frequencies_equal_torchtitans(name: str, dim: int) -> None:
    """deepseek-v3's rotary part (qk_rope_head_dim 64) against torchtitan's 671B flavor
    (rope_theta 10000, rope_factor 40, beta_fast 32, beta_slow 1, original_seq_len 4096);
    gpt-oss (head_dim 64, base 150000, factor 32) with 0.3.0's truncate=False."""
    from autoplan.runtime.models.layers import rope_inv_freq

    spec = PRESETS[name]
    s = spec.rope_scaling
    want = _torchtitan_yarn(dim, spec.rope_theta, s.factor, s.beta_fast, s.beta_slow,
                            s.original_max_position_embeddings, s.truncate)
    got = rope_inv_freq(dim, spec.rope_theta, CPU, s)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)
    plain = rope_inv_freq(dim, spec.rope_theta, CPU)
    ratio = (got / plain).tolist()
    # DeepSeek-V3's ramp runs over pairs 10..23 (floor 10.47, ceil 22.51): kept below, /40 past
    if name == "deepseek-v3":
        assert ratio[:11] == [1.0] * 11
        assert all(math.isclose(r, 1 / 40, rel_tol=1e-6) for r in ratio[23:])
        assert 1 / 40 < ratio[16] < 1.0


def test_deepseek_v3_softmax_scale_is_torchtitans() -> None:
    """torchtitan's deepseek_v3 Attention (0.2.2 model/model.py, 0.3.0 model.py): softmax_scale
    = qk_head_dim**-0.5 * mscale**2 with mscale = 0.1 * 1.0 * ln(40) + 1, the rotary tables
    unscaled. The runtime's MLA keeps that gain over 1/sqrt(q_head_dim) (192 in DeepSeek-V3,
    24 in tiny-mla), in the fused and the eager core."""
    from autoplan.runtime.models.mla import MultiHeadLatentAttention

    want_scale = 192 ** -0.5 * (0.1 * 1.0 * math.log(40.0) + 1.0) ** 2
    assert want_scale == pytest.approx(0.135234, rel=1e-5)
    spec = PRESETS["tiny-mla"].replace(rope_scaling=DEEPSEEK_V3_ROPE_SCALING)
    torch.manual_seed(0)
    layer = MultiHeadLatentAttention(spec)
    assert layer.softmax_gain * 192 ** -0.5 == pytest.approx(want_scale)
    plain = MultiHeadLatentAttention(spec.replace(rope_scaling=None))
    plain.load_state_dict(layer.state_dict())
    q = torch.randn(1, 4, 8, 24)
    k, v = torch.randn(1, 4, 8, 24), torch.randn(1, 4, 8, 24)
    scale = layer.softmax_gain / math.sqrt(24)
    scores = (q @ k.transpose(-2, -1)) * scale
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    want = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v
    torch.testing.assert_close(layer.core(q, k, v), want, rtol=1e-5, atol=1e-6)
    layer.eager = True
    torch.testing.assert_close(layer.core(q, k, v), want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(plain.core(q, k, v), want)


def test_the_softmax_gain_is_the_kernels_scale_not_a_product_with_q(monkeypatch) -> None:
    """SDPA gets scale = gain / sqrt(d) and q as it came (q * gain would round q once more in
    bf16 and cost an op); torchtitan's deepseek_v3 passes scale= too."""
    import torch.nn.functional as F

    from autoplan.runtime.models.mla import MultiHeadLatentAttention

    layer = MultiHeadLatentAttention(PRESETS["tiny-mla"].replace(
        rope_scaling=DEEPSEEK_V3_ROPE_SCALING))
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q, kw.get("scale")))
        return sdpa(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q = torch.randn(1, 4, 8, 24, dtype=torch.bfloat16)
    layer.core(q, q.clone(), q.clone())
    [(given, scale)] = seen
    assert torch.equal(given, q) and scale == pytest.approx(layer.softmax_gain / math.sqrt(24))


def test_gpt_oss_cos_sin_carry_the_attention_factor() -> None:
    """HF's convention (GptOssRotaryEmbedding: cos * attention_scaling) and torchtitan 0.2.2's
    gpt_oss precompute_rope_cache (cos = theta.cos() * mscale, mscale = 0.1 ln(32) + 1)."""
    from autoplan.runtime.models.layers import rope_cos_sin, rope_inv_freq

    s = GPT_OSS_ROPE_SCALING
    cos, sin = rope_cos_sin(16, 64, CPU, 150000.0, s)
    angles = torch.outer(torch.arange(16, dtype=torch.float32),
                         rope_inv_freq(64, 150000.0, CPU, s))
    torch.testing.assert_close(cos, angles.cos() * 1.3465735902799727)
    torch.testing.assert_close(sin, angles.sin() * 1.3465735902799727)
    assert PRESETS["tiny-llama"].replace(rope_scaling=s).rope_scaling.softmax_gain == 1.0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla"])
def test_attention_rotates_with_yarn(name: str) -> None:
    """The same weights give other outputs once the model takes YaRN (a 16-token original
    window puts pairs in the ramp)."""
    from autoplan.runtime.models.layers import Attention
    from autoplan.runtime.models.mla import MultiHeadLatentAttention

    Layer = MultiHeadLatentAttention if name == "tiny-mla" else Attention
    spec = PRESETS[name]
    scaled = spec.replace(rope_scaling=RopeScaling(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=1.0,
        mscale_all_dim=1.0))
    torch.manual_seed(0)
    base, other = Layer(spec), Layer(scaled)
    other.load_state_dict(base.state_dict())
    x = torch.randn(1, 16, spec.hidden_size)
    with torch.no_grad():
        assert not torch.allclose(base(x), other(x))


def test_context_parallel_tables_use_yarn() -> None:
    from types import SimpleNamespace

    from autoplan.runtime.context_parallel import ContextParallel
    from autoplan.runtime.models.layers import rope_cos_sin

    mesh = SimpleNamespace(size=lambda: 2, get_local_rank=lambda: 0)
    cp = ContextParallel(mesh)
    cos, sin = cp.rope_cos_sin(8, 64, CPU, 150000.0, GPT_OSS_ROPE_SCALING)
    want_cos, want_sin = rope_cos_sin(16, 64, CPU, 150000.0, GPT_OSS_ROPE_SCALING)
    pos = cp.positions(8, CPU)
    torch.testing.assert_close(cos, want_cos[pos])
    torch.testing.assert_close(sin, want_sin[pos])


def test_a_checkpoint_saved_before_the_preset_took_yarn_is_refused_naming_both(tmp_path) -> None:
    """A deepseek-v3 run saved before the preset took its YaRN: the weights fit, so the refusal
    names both rotations and how to resume (tiny-mla stands in: its shapes are small)."""
    from autoplan.plan import plan_from_dict
    from autoplan.runtime.checkpoint_compat import check_resumable, model_changes, model_fields
    from tests.unit.fake_checkpoint import saved_as

    before = PRESETS["tiny-mla"]
    now = before.replace(rope_scaling=DEEPSEEK_V3_ROPE_SCALING)
    old = {"model": model_fields(before)}
    assert [c.split(" ")[0] for c in model_changes(old, now)] == ["model.rope_scaling"]
    assert model_changes({"model": model_fields(now)}, now) == []  # saved with it: resumes
    plan = plan_from_dict({"model": "tiny-mla", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    found = saved_as(before, tmp_path)
    assert found.meta == old
    with pytest.raises(ConfigError) as err:
        check_resumable(found, plan, now)
    assert str(err.value) == (
        f"--resume: {tmp_path / 'step-00000003'} was trained at RoPE base 10000 without "
        "scaling, this model rotates at RoPE base 10000 with YaRN scaling (factor 40, "
        "original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, truncate true; "
        "cos/sin x1, softmax x1.874) (the presets took their published bases and scaling "
        "after it was saved); resume with a model file that sets no rope_scaling, or start a "
        "new run in an empty --checkpoint-dir")


def test_a_checkpoint_resumes_under_a_yarn_spelt_otherwise() -> None:
    """meta.json's rope_scaling and the model's are compared by effect: DeepSeek-V3's
    mscale = mscale_all_dim = 1 saved, attention_factor 1 with mscale_all_dim 1 now (the same
    rotation and softmax scale) is no change; another softmax scale is."""
    from autoplan.runtime.checkpoint_compat import model_changes, model_fields

    saved = {"model": model_fields(PRESETS["tiny-mla"].replace(
        rope_scaling=DEEPSEEK_V3_ROPE_SCALING))}
    same = RopeScaling(**YARN, attention_factor=1.0, mscale_all_dim=1.0)
    assert model_fields(PRESETS["tiny-mla"].replace(rope_scaling=same)) != saved["model"]
    assert model_changes(saved, PRESETS["tiny-mla"].replace(rope_scaling=same)) == []
    other = RopeScaling(**YARN, mscale_all_dim=0.707)
    assert [c.split(" ")[0] for c in model_changes(
        saved, PRESETS["tiny-mla"].replace(rope_scaling=other))] == ["model.rope_scaling"]


@pytest.mark.parametrize("name", ["deepseek-v3", "gpt-oss-120b"])
def test_stored_studies_of_the_yarn_presets_resume(name: str) -> None:
    """No step time depends on the rotation: a search or tune study of deepseek-v3 or gpt-oss
    stored before their presets took YaRN hashes the model as now (model_hash and the search
    fingerprint leave rope_scaling out, model_spec.OMITTED_AT_DEFAULT)."""
    from autoplan.search.optuna_search import model_hash

    model = PRESETS[name]
    assert model.rope_scaling is not None
    assert model_hash(model) == model_hash(model.replace(rope_scaling=None))
    assert model_hash(model) != model_hash(model.replace(num_layers=model.num_layers - 1))
