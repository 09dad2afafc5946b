"""Import of a local Hugging Face `config.json` into a ModelSpec (no network, no transformers).

Decoder-only families only: Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma 2, GPT-2, GPT-NeoX. Every
value is type-checked (no truthiness), encoder models are refused, and the training sequence
length is the model's pre-training context, not its longest supported window. The norms'
epsilon and Qwen3's per-head QK-norm are read too. Sliding-window
attention, logit soft-capping and biases a ModelSpec cannot hold (Llama's `attention_bias` or
`mlp_bias` alone) are not modelled: reading them warns, saying which way it leans.
This file picks the family and builds the spec; model_hf_values reads single values (sequence
length, epsilon, RoPE), model_hf_attention the attention's biases, windows and caps, and
model_hf_moe the mixture-of-experts families.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_hf_attention import linear_biases, unmodelled_attention
from autoplan.model_hf_values import (
    DEFAULT_SEQ_LEN,
    _bool,
    _capped_context,
    _int,
    _rope_scaling,
    _rope_theta,
    norm_eps,
    training_seq_len,
)
from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind
from autoplan.yaml_io import show
from autoplan.yaml_parse import load_json_text

log = logging.getLogger(__name__)

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2")
"""Families with HF's Llama block: q/k/v/o projections and a gated MLP (gate, up, down)."""
SUPPORTED = (*LLAMA_LIKE, "gpt2", "gpt_neox",
             "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss")  # model_hf_moe
TIED_BY_DEFAULT = {"gemma": True, "gemma2": True}
"""`tie_word_embeddings` when the file leaves it out, as each family's HF config class sets it
(GemmaConfig/Gemma2Config: True; LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
GPTNeoXConfig: False)."""
ENCODERS = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta",
    "deberta-v2", "camembert", "mpnet", "modernbert", "ernie", "longformer", "big_bird",
    "t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper", "led",
})
"""model_type values of encoder and encoder-decoder models (refused by name)."""
GATE_ACTIVATIONS = {
    "silu": MlpKind.SWIGLU, "swish": MlpKind.SWIGLU,
    "gelu": MlpKind.GEGLU, "gelu_new": MlpKind.GEGLU, "gelu_fast": MlpKind.GEGLU,
    "gelu_pytorch_tanh": MlpKind.GEGLU, "gelu_python": MlpKind.GEGLU,
}
"""The gate's activation of a Llama-style MLP: SiLU is SwiGLU, any GELU is GeGLU (Gemma)."""
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
"""Families whose attention RMS-normalises q and k per head over head_dim before RoPE (ModelSpec
qk_norm): Qwen3Attention and Qwen3MoeAttention build q_norm and k_norm whatever the config says
(no key for it). Of the others none has it (Gemma 3 and OLMo 2, which do, are not read here;
OLMo 2's norms span the whole q and k width, not a head)."""


@functools.cache
def _warn_capped(path: str, longest: int) -> None:
    """Say once per file and process that the sequence length is a guess, however many times a
    process loads the file (a plan's model is read again from its path wherever a caller has
    only the plan)."""
    log.warning("%s: max_position_embeddings %d; planning for %d-token training sequences "
                "(pass --seq-len to change)", path, longest, DEFAULT_SEQ_LEN)


@functools.cache
def _warn_unmodelled(path: str, note: str) -> None:
    """Say once per file and process what the config's attention does that is not modelled."""
    log.warning("%s: %s", path, note)


def _gated_mlp(cfg: dict[str, Any], where: str) -> MlpKind:
    key = "hidden_activation" if cfg.get("hidden_activation") is not None else "hidden_act"
    act = cfg.get(key, "silu")
    if not isinstance(act, str) or act not in GATE_ACTIVATIONS:
        raise ConfigError(f"{where} {key}", f"got {show(act)}",
                          f"autoplan models a gate with {', '.join(GATE_ACTIVATIONS)}")
    return GATE_ACTIVATIONS[act]


def _llama_like(cfg: dict[str, Any], where: str, name: str, kind: str) -> ModelSpec:
    heads = _int(cfg, where, "num_attention_heads")
    kv = cfg.get("num_key_value_heads")
    head_dim = cfg.get("head_dim")
    bias, qkv_bias = linear_biases(cfg, where, kind)
    return ModelSpec(
        name=name, num_layers=_int(cfg, where, "num_hidden_layers"),
        hidden_size=_int(cfg, where, "hidden_size"), num_heads=heads,
        num_kv_heads=heads if kv is None else _int(cfg, where, "num_key_value_heads"),
        head_dim=None if head_dim is None else _int(cfg, where, "head_dim"),
        ffn_hidden_size=_int(cfg, where, "intermediate_size"),
        vocab_size=_int(cfg, where, "vocab_size"), seq_len=training_seq_len(cfg, where),
        mlp=_gated_mlp(cfg, where), norm=NormKind.RMSNORM, position=PositionKind.ROPE,
        bias=bias, qkv_bias=qkv_bias, qk_norm=kind in QK_NORM_FAMILIES,
        norm_eps=norm_eps(cfg, where, kind), rope_theta=_rope_theta(cfg, where, kind),
        rope_scaling=_rope_scaling(cfg, where),
        tie_embeddings=_bool(cfg, where, "tie_word_embeddings", TIED_BY_DEFAULT.get(kind, False)),
    )


def _build(cfg: dict[str, Any], where: str, name: str, kind: str) -> ModelSpec:
    from autoplan.model_hf_moe import MOE_FAMILIES, from_moe_config

    if kind in MOE_FAMILIES:
        return from_moe_config(cfg, where, name, kind)
    if kind == "gpt2":
        hidden = _int(cfg, where, "n_embd")
        return ModelSpec(
            name=name, num_layers=_int(cfg, where, "n_layer"), hidden_size=hidden,
            num_heads=_int(cfg, where, "n_head"),
            ffn_hidden_size=_int(cfg, where, "n_inner", default=4 * hidden),
            vocab_size=_int(cfg, where, "vocab_size"),
            # learned positions: the table has n_positions rows, so no cap here
            seq_len=_int(cfg, where, "n_positions", "n_ctx"),
            norm_eps=norm_eps(cfg, where, kind),
            tie_embeddings=_bool(cfg, where, "tie_word_embeddings", True),
        )
    if kind == "gpt_neox":
        return ModelSpec(
            name=name, num_layers=_int(cfg, where, "num_hidden_layers"),
            hidden_size=_int(cfg, where, "hidden_size"),
            num_heads=_int(cfg, where, "num_attention_heads"),
            ffn_hidden_size=_int(cfg, where, "intermediate_size"),
            vocab_size=_int(cfg, where, "vocab_size"), seq_len=training_seq_len(cfg, where),
            position=PositionKind.ROPE, rope_theta=_rope_theta(cfg, where, kind),
            rope_scaling=_rope_scaling(cfg, where), norm_eps=norm_eps(cfg, where, kind),
            tie_embeddings=_bool(cfg, where, "tie_word_embeddings", False),
        )
    return _llama_like(cfg, where, name, kind)


def from_hf_config(path: str | Path, field: str = "--model",
                   seq_len: int | None = None) -> ModelSpec:
    """Read a Hugging Face `config.json` of a decoder-only model family in SUPPORTED; `field`
    is where the path was given (`--model`, or `model` in a plan), for errors; `seq_len` the
    training sequence length the user chose (`--seq-len`), else the config's is planned for."""
    p = Path(path)
    where = f"{field} {p}"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(field, f"no such file {str(p)!r}", "check the path") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(where, f"cannot read the file ({err.__class__.__name__})") from None
    cfg = load_json_text(text, where)
    if not isinstance(cfg, dict):
        raise ConfigError(where, "expected a JSON object at the top level")
    kind = cfg.get("model_type", "")
    if not isinstance(kind, str):
        raise ConfigError(f"{where} model_type", f"got {show(kind)}",
                          f"supported: {', '.join(SUPPORTED)}")
    if kind in ENCODERS or cfg.get("is_encoder_decoder") is True:
        raise ConfigError(f"{where} model_type", f"{show(kind)} is an encoder model",
                          "autoplan plans decoder-only transformers")
    if kind not in SUPPORTED:
        raise ConfigError(f"{where} model_type", f"got {show(kind)}",
                          f"supported: {', '.join(SUPPORTED)}")
    raw_name = cfg.get("_name_or_path")
    readable = isinstance(raw_name, str) and raw_name.strip() and raw_name.isprintable()
    name = raw_name if readable else p.parent.name or kind
    try:
        spec = _build(cfg, where, str(name)[:200], kind)
    except ConfigError as err:
        if err.field.startswith("model."):  # a shape rule of ModelSpec: say which file
            raise ConfigError(f"{where} {err.field}", err.problem, err.fix) from None
        raise
    if seq_len is not None:
        spec = spec.replace(seq_len=seq_len)
    else:
        longest = _capped_context(cfg, kind)
        if longest is not None:
            _warn_capped(str(p), longest)
    note = unmodelled_attention(cfg, where, kind, spec)
    if note is not None:
        _warn_unmodelled(str(p), note)
    return spec
