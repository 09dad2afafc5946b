"""Norms of Hugging Face configs: Qwen3 and Qwen3-MoE read as qk_norm (per-head q and k norms,
counted), every family's epsilon as norm_eps (rms_norm_eps, GPT-2's layer_norm_epsilon,
GPT-NeoX's layer_norm_eps, else the family's HF default), checked strictly; saved files and study
hashes leave both out at their defaults."""

from __future__ import annotations

import json

import pytest
import yaml

from autoplan.cost.params import qk_norm_params, total_params
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, load_model, model_dict
from autoplan.search.optuna_search import model_hash
from autoplan.yaml_io import to_dict
from tests.unit.hf_configs import QWEN25_7B

QWEN3_8B = {  # huggingface.co/Qwen/Qwen3-8B/blob/main/config.json (the fields read)
    "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {  # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
    **QWEN3_8B, "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True,
}


def _read(tmp_path, cfg, **changes):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, **changes}))
    return load_model(str(path), seq_len=4096)


def test_qwen3_normalises_q_and_k_per_head_and_counts_the_norms(tmp_path) -> None:
    """Qwen3-8B: 36 blocks of 192,946,432 parameters (attention 41,943,040, MLP 150,994,944,
    two norms of 4096, q_norm and k_norm of 128), the final norm and two untied 151936 x 4096
    tables: 8,190,735,360, the model card's 8.2B (6.95B without the tables)."""
    m = _read(tmp_path, QWEN3_8B)
    assert (m.qk_norm, m.norm_eps) == (True, 1e-6)
    assert qk_norm_params(m) == 256
    assert total_params(m) == 8_190_735_360
    assert total_params(m) - total_params(m.replace(qk_norm=False)) == 36 * 256


def test_qwen3_moe_reads_as_the_preset(tmp_path) -> None:
    """Qwen3-30B-A3B's config.json is the qwen3-30b-a3b preset, QK-norm and epsilon included."""
    m = _read(tmp_path, QWEN3_30B_A3B)
    preset = PRESETS["qwen3-30b-a3b"]
    assert m == preset.replace(name=m.name)


@pytest.mark.parametrize(("cfg", "want"), [
    ({**QWEN25_7B}, 1e-6),  # stated
    ({**QWEN25_7B, "rms_norm_eps": 1e-5}, 1e-5),
    ({k: v for k, v in QWEN25_7B.items() if k != "rms_norm_eps"}, 1e-6),  # Qwen2Config's
    ({k: v for k, v in QWEN25_7B.items() if k != "rms_norm_eps"} | {"model_type": "llama"},
     1e-6),  # LlamaConfig's default (Llama 2/3 files state 1e-5)
    ({k: v for k, v in QWEN25_7B.items() if k != "rms_norm_eps"} | {"model_type": "mixtral",
     "num_local_experts": 8, "num_experts_per_tok": 2}, 1e-5),  # MixtralConfig's
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
      "n_positions": 64, "layer_norm_epsilon": 1e-6}, 1e-6),
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
      "n_positions": 64}, 1e-5),  # GPT2Config's
    ({"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 256,
      "max_position_embeddings": 64, "layer_norm_eps": 1e-6}, 1e-6),
])
def test_the_epsilon_is_read_or_takes_the_familys_default(tmp_path, cfg, want) -> None:
    m = _read(tmp_path, cfg)
    assert m.norm_eps == want
    assert m.qk_norm is False  # none of these families normalises q and k


@pytest.mark.parametrize("bad", ["1e-6", True, 0, -1e-6, 1.0, float("inf")])
def test_a_bad_epsilon_is_refused_naming_the_key(tmp_path, bad) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_8B, "rms_norm_eps": bad}).replace("Infinity", "1e999"))
    with pytest.raises(ConfigError) as err:
        load_model(str(path))
    assert "rms_norm_eps" in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.parametrize(("changes", "field"), [
    ({"qk_norm": "yes"}, "model.qk_norm"), ({"qk_norm": 1}, "model.qk_norm"),
    ({"qk_norm": True, "norm": "layernorm"}, "model.qk_norm"),
    ({"norm_eps": 0}, "model.norm_eps"), ({"norm_eps": "tiny"}, "model.norm_eps"),
    ({"norm_eps": 0.5}, "model.norm_eps"), ({"norm_eps": True}, "model.norm_eps"),
])
def test_model_files_are_checked_strictly(changes, field) -> None:
    data = {**model_dict(to_dict(PRESETS["tiny-llama"])), **changes}
    with pytest.raises(ConfigError) as err:
        load_model(data)
    assert str(err.value).startswith(field)


def test_a_yaml_epsilon_without_a_dot_reads_as_a_number() -> None:
    """YAML 1.1 (yaml.safe_load) reads `1e-6` as a string: a model file's norm_eps: 1e-6 is the
    number a user means, as rope_theta's 5e5 is."""
    text = yaml.safe_dump(model_dict(to_dict(PRESETS["tiny-llama"]))) + "norm_eps: 1e-6\n"
    data = yaml.safe_load(text)
    assert data["norm_eps"] == "1e-6"
    assert load_model(data).norm_eps == 1e-6


def test_qk_norm_with_latent_attention_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^model.qk_norm: true with mla"):
        PRESETS["tiny-mla"].replace(qk_norm=True)


def test_saved_files_and_hashes_leave_both_out_at_their_defaults() -> None:
    """A model file or plan written before the fields reads back the same; a study's hash
    leaves norm_eps out whatever its value (no figure depends on it) and qk_norm out at false
    only (it changes the parameter count)."""
    llama = PRESETS["llama-3-8b"]
    saved = model_dict(to_dict(llama))
    assert "qk_norm" not in saved and "norm_eps" not in saved
    qwen3 = model_dict(to_dict(PRESETS["qwen3-30b-a3b"]))
    assert (qwen3["qk_norm"], qwen3["norm_eps"]) == (True, 1e-6)
    assert load_model(yaml.safe_load(yaml.safe_dump(qwen3))) == PRESETS["qwen3-30b-a3b"]
    assert model_hash(llama.replace(norm_eps=1e-6)) == model_hash(llama)
    assert model_hash(llama.replace(qk_norm=True)) != model_hash(llama)
