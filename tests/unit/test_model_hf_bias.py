"""Biases of Hugging Face configs: Qwen2 (q, k and v alone) reads as qkv_bias, Llama's
attention_bias with mlp_bias as bias on every Linear, either alone warns naming what is left out
and how many parameters; the parameter count holds what the config's model holds."""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from autoplan.cost.params import layer_params, tensors_per_layer, total_params
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, ModelSpec, load_model, model_dict
from autoplan.search.optuna_search import model_hash
from autoplan.yaml_io import to_dict
from tests.unit.hf_configs import QWEN25_7B

LLAMA_3_8B = {  # meta-llama/Meta-Llama-3-8B config.json (the shape)
    "model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 128256, "max_position_embeddings": 8192, "hidden_act": "silu",
    "rope_theta": 500000.0, "tie_word_embeddings": False,
}
LLAMA_3_8B_PARAMS = 8_030_261_248
"""llama-3-8b's count without biases (the preset's; what the biased configs used to read as)."""


def _write(tmp_path, cfg, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _not_modelled(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "not modelled:" in r.getMessage()]


def test_qwen2_reads_q_k_v_biases_and_counts_them(tmp_path, caplog) -> None:
    """Qwen2.5-7B: 28 layers, q 28 x 128 = 3584 wide, k and v 4 x 128 = 512 each; one bias per
    output of q, k and v in every layer, none on o_proj or the MLP (Qwen2Attention)."""
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        m = load_model(_write(tmp_path, QWEN25_7B))
    assert (m.bias, m.qkv_bias) == (False, True)
    assert _not_modelled(caplog) == []  # Qwen2's biases are modelled exactly
    layers, h, f, v = 28, 3584, 18944, 152064
    q, kv = 28 * 128, 4 * 128
    weights = layers * (h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h) + 2 * v * h + h
    biases = layers * (q + 2 * kv)
    assert biases == 129_024  # 28 x (3584 + 512 + 512)
    assert total_params(m) == weights + biases == 7_615_616_512  # the model card's 7.61B
    assert total_params(m.replace(qkv_bias=False)) == weights
    assert tensors_per_layer(m) == tensors_per_layer(m.replace(qkv_bias=False)) + 3


def test_qwen2_moe_reads_its_qkv_bias_key(tmp_path) -> None:
    """Qwen2MoeConfig's qkv_bias (default true) decides q, k and v's biases."""
    cfg = {**QWEN25_7B, "model_type": "qwen2_moe", "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
           "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
           "num_key_value_heads": 16, "intermediate_size": 5632}
    assert load_model(_write(tmp_path, cfg)).qkv_bias is True
    off = load_model(_write(tmp_path, {**cfg, "qkv_bias": False}, "off.json"))
    assert (off.bias, off.qkv_bias) == (False, False)
    with pytest.raises(ConfigError, match="qkv_bias: got 'yes'"):
        load_model(_write(tmp_path, {**cfg, "qkv_bias": "yes"}, "bad.json"))


def test_llama_attention_and_mlp_bias_read_as_bias_on_every_linear(tmp_path, caplog) -> None:
    """The user's file: attention_bias and mlp_bias true read as a bias-free llama-3-8b
    (8,030,261,248) without a word; HF biases q, k, v, o and gate, up, down."""
    cfg = {**LLAMA_3_8B, "attention_bias": True, "mlp_bias": True}
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        m = load_model(_write(tmp_path, cfg))
    assert (m.bias, m.qkv_bias) == (True, False)
    assert _not_modelled(caplog) == []
    per_layer = (4096 + 2 * 1024) + 4096 + (2 * 14336 + 4096)  # q, k, v, o; gate, up, down
    assert total_params(m) == LLAMA_3_8B_PARAMS + 32 * per_layer == 8_031_637_504


@pytest.mark.parametrize(("stated", "bias", "qkv_bias", "said", "missing"), [
    ({"attention_bias": True}, False, True,
     "attention_bias true: o_proj's biases (32 layers x 4096 = 131,072 parameters; priced and "
     "trained with q, k and v's alone, qkv_bias: the parameter count leans low)", 32 * 4096),
    ({"mlp_bias": True}, False, False,
     "mlp_bias true: the MLP's biases (32 layers x 32768 = 1,048,576 parameters; priced and "
     "trained without them, as autoplan biases every Linear or q, k and v alone: the parameter "
     "count leans low)", 32 * (2 * 14336 + 4096)),
], ids=["attention-alone", "mlp-alone"])
def test_one_of_llama_s_biases_alone_warns_what_is_left_out(tmp_path, caplog, stated, bias,
                                                            qkv_bias, said, missing) -> None:
    path = _write(tmp_path, {**LLAMA_3_8B, **stated})
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        m = load_model(path)
    assert (m.bias, m.qkv_bias) == (bias, qkv_bias)
    assert _not_modelled(caplog) == [
        f"{path}: not modelled: {said}; `autoplan train` runs without them too"]
    # what HF builds: every bias the file states; autoplan's count is short by what it said
    stated_biases = 32 * ((4096 + 2 * 1024 + 4096) * stated.get("attention_bias", False)
                          + (2 * 14336 + 4096) * stated.get("mlp_bias", False))
    assert LLAMA_3_8B_PARAMS + stated_biases - total_params(m) == missing


@pytest.mark.parametrize(("kind", "extra"), [
    ("qwen3", {"head_dim": 128}), ("gemma", {"hidden_act": "gelu_pytorch_tanh"})])
def test_attention_bias_of_qwen3_and_gemma_biases_q_k_v(tmp_path, caplog, kind, extra) -> None:
    """Qwen3Attention and GemmaAttention bias q, k, v and o by attention_bias: q, k and v are
    kept, o_proj's are named."""
    path = _write(tmp_path, {**LLAMA_3_8B, **extra, "model_type": kind, "attention_bias": True})
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        m = load_model(path)
    assert m.qkv_bias and not m.bias
    [said] = _not_modelled(caplog)
    assert "o_proj's biases (32 layers x 4096 = 131,072 parameters" in said


@pytest.mark.parametrize("kind", ["mistral", "mixtral"])
def test_families_that_build_no_bias_ignore_the_keys(tmp_path, kind) -> None:
    """MistralAttention and MixtralAttention are built with bias=False whatever the file says."""
    cfg = {**LLAMA_3_8B, "model_type": kind, "attention_bias": True, "mlp_bias": True,
           "sliding_window": None}
    if kind == "mixtral":
        cfg.update(num_local_experts=8, num_experts_per_tok=2)
    m = load_model(_write(tmp_path, cfg))
    assert (m.bias, m.qkv_bias) == (False, False)


def test_deepseek_v3_attention_bias_is_refused(tmp_path) -> None:
    from tests.unit.test_moe_spec import DEEPSEEK_V3

    with pytest.raises(ConfigError) as err:
        load_model(_write(tmp_path, {**DEEPSEEK_V3, "attention_bias": True}))
    assert "attention_bias: true" in str(err.value) and "\n" not in str(err.value)


def test_attention_bias_must_be_a_json_bool(tmp_path) -> None:
    with pytest.raises(ConfigError, match="attention_bias: got 1 "):
        load_model(_write(tmp_path, {**LLAMA_3_8B, "attention_bias": 1}))


# ---- the ModelSpec field -----------------------------------------------------------------------

TINY_QWEN = dict(name="tiny-qwen", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                 ffn_hidden_size=176, vocab_size=256, seq_len=64, mlp="swiglu", norm="rmsnorm",
                 position="rope", bias=False, qkv_bias=True)


def test_the_field_counts_q_k_v_biases_per_layer() -> None:
    m = load_model(dict(TINY_QWEN))
    plain = m.replace(qkv_bias=False)
    assert layer_params(m) - layer_params(plain) == 64 + 2 * 2 * 16  # q 64, k and v 32 each


@pytest.mark.parametrize(("change", "said"), [
    ({"bias": True}, "model.qkv_bias: true with bias: true"),
    ({"qkv_bias": "true"}, "model.qkv_bias: got 'true' (str); expected true or false"),
])
def test_a_bad_qkv_bias_is_one_line(change, said) -> None:
    with pytest.raises(ConfigError) as err:
        load_model({**TINY_QWEN, **change})
    assert str(err.value).startswith(said) and "\n" not in str(err.value)


def test_qkv_bias_with_latent_attention_is_refused() -> None:
    with pytest.raises(ConfigError, match="model.qkv_bias: true with mla"):
        PRESETS["tiny-mla"].replace(qkv_bias=True)


def test_saved_models_and_hashes_leave_it_out_at_its_default_only(tmp_path) -> None:
    """Files, plans, checkpoints and studies written before the field read and hash the same;
    a model with q, k and v biases is another model to a study (its parameter count differs)."""
    llama = PRESETS["llama-3-8b"]
    assert "qkv_bias" not in model_dict(to_dict(llama))
    m = load_model(dict(TINY_QWEN))
    saved = model_dict(to_dict(m))
    assert saved["qkv_bias"] is True
    path = tmp_path / "tiny-qwen.yaml"
    path.write_text(yaml.safe_dump(saved))
    assert load_model(str(path)) == m
    assert model_hash(m) != model_hash(m.replace(qkv_bias=False))
    assert model_hash(m.replace(qkv_bias=False, rope_theta=5e5)) == model_hash(
        m.replace(qkv_bias=False))


def test_a_preset_is_unchanged() -> None:
    assert all(not m.qkv_bias for m in PRESETS.values())
    assert total_params(PRESETS["llama-3-8b"]) == LLAMA_3_8B_PARAMS
    assert isinstance(PRESETS["llama-3-8b"], ModelSpec)
