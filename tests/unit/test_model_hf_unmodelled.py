"""A Hugging Face config.json whose attention autoplan does not model (a sliding window,
logit soft-capping) says so once per file, naming the fields and which way the estimate leans;
a window the training sequence fits in changes nothing and says nothing."""

from __future__ import annotations

import json
import logging

import pytest

from autoplan.errors import ConfigError
from autoplan.model_spec import load_model
from tests.unit.hf_configs import QWEN25_7B

MISTRAL_7B_V01 = {  # huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32000,
}
GEMMA2_9B = {  # huggingface.co/google/gemma-2-9b/blob/main/config.json
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "sliding_window_size": 4096, "torch_dtype": "float32",
    "use_cache": True, "vocab_size": 256000,
}
GPT_OSS_20B = {  # huggingface.co/openai/gpt-oss-20b/blob/main/config.json (the MoE parts)
    "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
    "attention_bias": True, "hidden_act": "silu", "tie_word_embeddings": False,
    "max_position_embeddings": 131072, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
}
SOFTCAPS = ("attn_logit_softcapping 50 and final_logit_softcapping 30 (priced without the tanh "
            "caps: step time leans slightly low)")


def _write(tmp_path, cfg, name="config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "not modelled:" in r.getMessage()]


def _window(window: int, sliding: int, layers: int, tokens: int) -> str:
    return (f"sliding_window {window} on {sliding} of {layers} layers (priced as full causal "
            f"attention over all {tokens} tokens: attention time, and its memory under eager "
            "attention, lean high)")


def test_mistral_s_window_is_said_once_per_file(tmp_path, caplog) -> None:
    """Mistral-7B-v0.1 trains 8192-token sequences past its 4096-token window on every layer:
    it was priced as full causal attention without a word."""
    path = _write(tmp_path, MISTRAL_7B_V01)
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        assert load_model(path).seq_len == 8192
        load_model(path, "model")  # a plan's reload of the same file says nothing more
    assert _warnings(caplog) == [f"{path}: not modelled: {_window(4096, 32, 32, 8192)}; "
                                 "`autoplan train` runs without them too"]


def test_gemma2_s_alternating_window_and_soft_caps_are_named(tmp_path, caplog) -> None:
    path = _write(tmp_path, GEMMA2_9B)
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        load_model(path)
    assert _warnings(caplog) == [f"{path}: not modelled: {_window(4096, 21, 42, 8192)}; "
                                 f"{SOFTCAPS}; `autoplan train` runs without them too"]


@pytest.mark.parametrize(("cfg", "seq_len", "said"), [
    (MISTRAL_7B_V01, 4096, None),  # the sequence fits in the window: it changes nothing
    ({**MISTRAL_7B_V01, "sliding_window": None}, None, None),  # Mistral-7B-v0.2 and later
    ({k: v for k, v in MISTRAL_7B_V01.items() if k != "sliding_window"}, None,
     _window(4096, 32, 32, 8192)),  # MistralConfig's default window
    (GEMMA2_9B, 4096, SOFTCAPS),  # the caps whatever the length
    ({**GEMMA2_9B, "attn_logit_softcapping": None, "final_logit_softcapping": None}, 2048,
     None),
    (QWEN25_7B, None, None),  # a window use_sliding_window turns off
    ({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 21},
     None, _window(4096, 7, 28, 8192)),  # Qwen2: the layers from max_window_layers on
    (GPT_OSS_20B, None, _window(128, 12, 24, 4096)),  # layer_types: every other layer
], ids=["mistral-seq-in-window", "mistral-no-window", "mistral-default-window",
        "gemma2-seq-in-window", "gemma2-nothing", "qwen2.5-off", "qwen2-on", "gpt-oss"])
def test_what_is_said_and_when(tmp_path, caplog, cfg, seq_len, said) -> None:
    path = _write(tmp_path, cfg)
    with caplog.at_level(logging.WARNING, logger="autoplan.model_hf"):
        load_model(path, seq_len=seq_len)
    assert _warnings(caplog) == ([] if said is None else [
        f"{path}: not modelled: {said}; `autoplan train` runs without them too"])


@pytest.mark.parametrize(("key", "value"), [("sliding_window", "4096"),
                                            ("sliding_window", 0),
                                            ("final_logit_softcapping", True),
                                            ("attn_logit_softcapping", -1.0)])
def test_a_bad_window_or_cap_names_the_key(tmp_path, key, value) -> None:
    with pytest.raises(ConfigError, match=key):
        load_model(_write(tmp_path, {**GEMMA2_9B, key: value}))
