"""Model presets and Hugging Face config import."""

from __future__ import annotations

import json

import pytest

from autoplan.cost.params import total_params
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, MlpKind, ModelSpec, load_model


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # Brown et al. 2020, Table 2.1; Touvron et al. 2023 (Llama 2); Dubey et al. 2024 (Llama 3);
        # Jiang et al. 2023 (Mistral). Figures as the model cards state them.
        # (GPT-3 1.3B and 13B are left out: Table 2.1's rows for them do not multiply out, see
        # autoplan/model_spec.py, so their names are not a count to check against.)
        ("gpt3-125m", 125e6), ("gpt3-6.7b", 6.7e9),
        ("gpt3-175b", 174.6e9), ("llama-2-7b", 6.74e9), ("llama-2-13b", 13.02e9),
        ("llama-2-70b", 68.98e9), ("llama-3-8b", 8.03e9), ("llama-3-70b", 70.55e9),
        ("llama-3.1-405b", 405.85e9), ("mistral-7b", 7.24e9),
    ],
)
def test_parameter_counts_match_published(name: str, published: float) -> None:
    assert total_params(PRESETS[name]) == pytest.approx(published, rel=0.01)


def test_defaults_resolve() -> None:
    m = ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, vocab_size=10, seq_len=8)
    assert m.num_kv_heads == 4 and m.ffn_hidden_size == 256 and m.mlp is MlpKind.GELU


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"num_heads": 5}, "model.num_heads"),
        ({"num_kv_heads": 3}, "model.num_kv_heads"),
        ({"num_layers": 0}, "model.num_layers"),
        ({"dropout": 1.5}, "model.dropout"),
    ],
)
def test_bad_shapes_name_the_field(fields: dict, field: str) -> None:
    base = dict(name="x", num_layers=2, hidden_size=64, num_heads=4, vocab_size=10, seq_len=8)
    with pytest.raises(ConfigError) as err:
        ModelSpec(**{**base, **fields})
    assert err.value.field == field


def _write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_import_llama3_config(tmp_path) -> None:
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 128256, "max_position_embeddings": 8192, "hidden_act": "silu",
           "tie_word_embeddings": False}
    m = load_model(_write(tmp_path, cfg))
    assert total_params(m) == total_params(PRESETS["llama-3-8b"])


def test_import_qwen2_mistral_gpt2_neox(tmp_path) -> None:
    qwen = {"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
            "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
            "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True}
    assert load_model(_write(tmp_path, qwen)).kv_heads == 2
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
            "vocab_size": 50257, "n_positions": 1024}
    assert total_params(load_model(_write(tmp_path, gpt2))) == pytest.approx(124.4e6, rel=0.01)
    neox = {"model_type": "gpt_neox", "num_hidden_layers": 44, "hidden_size": 6144,
            "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
            "max_position_embeddings": 2048}  # GPT-NeoX-20B: 20.6B (Black et al. 2022)
    assert total_params(load_model(_write(tmp_path, neox))) == pytest.approx(20.55e9, rel=0.01)


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2]", json.dumps({"model_type": "t5"}),
     json.dumps({"model_type": "llama", "hidden_size": 64}),
     json.dumps({"model_type": "gpt2", "n_layer": "twelve", "n_embd": 64, "n_head": 4,
                 "vocab_size": 10, "n_positions": 8})],
)
def test_malformed_config_json_is_a_config_error(tmp_path, content: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError):
        load_model(str(path))


def test_config_json_errors_name_where_the_path_was_given(tmp_path) -> None:
    """A config.json named by a plan's `model` field is reported as `model`, not as the
    command line's `--model`."""
    missing = tmp_path / "config.json"
    with pytest.raises(ConfigError) as err:
        load_model(str(missing), "model")
    assert err.value.field == "model"
    missing.write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ConfigError) as err:
        load_model(str(missing), "model")
    assert err.value.field.startswith(f"model {missing}")
    with pytest.raises(ConfigError) as err:
        load_model(str(tmp_path / "nope.json"))
    assert err.value.field == "--model"


def test_unknown_preset_lists_choices() -> None:
    with pytest.raises(ConfigError, match="gpt3-175b"):
        load_model("gpt-5")


# ---- issue #14 item 18: Gemma-2, Qwen3, strict booleans, encoders, training context -----------

GEMMA2_27B = {  # google/gemma-2-27b config.json
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 4608,
    "intermediate_size": 36864, "num_hidden_layers": 46, "num_attention_heads": 32,
    "num_key_value_heads": 16, "head_dim": 128, "vocab_size": 256000,
    "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
    "query_pre_attn_scalar": 144, "sliding_window": 4096,
}
QWEN3_32B = {  # Qwen/Qwen3-32B config.json
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
    "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "hidden_act": "silu", "tie_word_embeddings": False,
}
LLAMA31_8B = {  # meta-llama/Llama-3.1-8B config.json
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "max_position_embeddings": 131072, "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False,
}


def test_gemma2_27b_parameter_count(tmp_path) -> None:
    # Gemma Team 2024, "Gemma 2" (arXiv:2408.00118) and the google/gemma-2-27b model card:
    # 27.2B parameters (GeGLU: three MLP matrices; heads of 128, query width 4096 != 4608).
    m = load_model(_write(tmp_path, GEMMA2_27B))
    assert m.mlp is MlpKind.GEGLU and m.head_dim == 128 and m.q_width == 4096
    assert m.tie_embeddings and m.seq_len == 8192
    assert total_params(m) == pytest.approx(27.2e9, rel=0.005)


def test_qwen3_32b_parameter_count(tmp_path) -> None:
    # Qwen/Qwen3-32B model card: "Number of Parameters: 32.8B; Non-Embedding: 31.2B".
    m = load_model(_write(tmp_path, QWEN3_32B))
    assert m.q_width == 8192 and m.mlp is MlpKind.SWIGLU
    assert total_params(m) == pytest.approx(32.8e9, rel=0.005)
    non_embedding = total_params(m) - 2 * m.vocab_size * m.hidden_size
    assert non_embedding == pytest.approx(31.2e9, rel=0.005)


def test_head_dim_defaults_to_hidden_over_heads() -> None:
    m = ModelSpec(name="x", num_layers=2, hidden_size=64, num_heads=4, vocab_size=10, seq_len=8)
    assert m.head_dim == 16 and m.q_width == 64
    wide = m.replace(head_dim=32, num_heads=3, num_kv_heads=3)  # heads need not divide h
    assert wide.q_width == 96 and total_params(wide) > total_params(m)


@pytest.mark.parametrize("value", ["false", "true", 0, 1, [False]])
def test_tie_word_embeddings_must_be_a_json_boolean(tmp_path, value) -> None:
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        load_model(_write(tmp_path, {**QWEN3_32B, "tie_word_embeddings": value}))


@pytest.mark.parametrize("key, value", [("num_key_value_heads", 0), ("head_dim", 0),
                                        ("num_key_value_heads", "8"), ("hidden_size", 2**64),
                                        ("num_hidden_layers", True), ("hidden_act", "relu")])
def test_bad_hf_values_name_the_key(tmp_path, key, value) -> None:
    with pytest.raises(ConfigError, match=key):
        load_model(_write(tmp_path, {**QWEN3_32B, key: value}))


@pytest.mark.parametrize("kind", ["bert", "roberta", "t5"])
def test_encoder_models_are_refused_by_name(tmp_path, kind) -> None:
    bert = {"model_type": kind, "hidden_size": 768, "num_hidden_layers": 12,
            "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
            "max_position_embeddings": 512, "hidden_act": "gelu"}
    with pytest.raises(ConfigError, match=f"'{kind}' is an encoder"):
        load_model(_write(tmp_path, bert))


def test_seq_len_is_the_training_context(tmp_path) -> None:
    # Llama 3.1: 131072-token window, 8192-token pre-training (rope_scaling says so)
    llama31 = load_model(_write(tmp_path, LLAMA31_8B))
    assert llama31.seq_len == 8192
    assert llama31.rope_scaling == load_model("llama-3.1-8b").rope_scaling is not None
    no_scaling = {k: v for k, v in LLAMA31_8B.items() if k != "rope_scaling"}
    assert load_model(_write(tmp_path, no_scaling)).seq_len == 8192  # the stated default
    assert load_model(_write(tmp_path, QWEN3_32B)).seq_len == 8192
    short = {**no_scaling, "max_position_embeddings": 4096}  # Llama 2: 4096
    assert load_model(_write(tmp_path, short)).seq_len == 4096


def test_seq_len_flag_overrides_the_config(tmp_path) -> None:
    import argparse

    from autoplan.plan_args import resolve_model

    args = argparse.Namespace(model=_write(tmp_path, LLAMA31_8B), seq_len=2048)
    assert resolve_model(args).seq_len == 2048
