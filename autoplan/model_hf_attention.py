"""What a Hugging Face config's attention and Linears do beyond the block's shape: the biases a
ModelSpec holds (linear_biases), and the sliding windows, logit soft-caps and biases it cannot,
with which way the estimate leans (unmodelled_attention; model_hf warns once per file). Kept
apart from the builder in model_hf: each is a family-by-family reading of transformers' classes.
"""

from __future__ import annotations

import math
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_hf_values import _bool, _int
from autoplan.model_spec import ModelSpec
from autoplan.yaml_io import show

SLIDING_WINDOW_BY_DEFAULT = {"mistral": 4096, "gemma2": 4096, "gpt_oss": 128}
"""`sliding_window` when the file leaves it out, as each family's HF config class sets it
(MistralConfig, Gemma2Config: 4096; GptOssConfig: 128; the others: none). A JSON null is none."""
ALTERNATING_WINDOW = ("gemma2", "gpt_oss")
"""Families whose layers alternate sliding and full attention, the first one sliding, where the
file gives no `layer_types` (Gemma2Config, GptOssConfig: sliding when (i + 1) % 2)."""
GATED_WINDOW = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
"""Families whose window applies only with `use_sliding_window` (default false), and then to
the layers from `max_window_layers` on (Qwen2Config: the window is None unless it is set)."""
MAX_WINDOW_LAYERS = 28
"""Qwen2Config's (and Qwen3's, and their MoE's) `max_window_layers` default."""
SOFTCAPPING = ("attn_logit_softcapping", "final_logit_softcapping")
SOFTCAPPING_BY_DEFAULT = {"gemma2": {"attn_logit_softcapping": 50.0,
                                     "final_logit_softcapping": 30.0}}
"""Gemma2Config's tanh caps on the attention scores and the output logits, where the file
leaves them out (a JSON null turns one off)."""
QKV_BIAS_KEY = {"qwen2": None, "qwen2_moe": "qkv_bias"}
"""Families whose q, k and v projections carry biases and o_proj and the MLP none (ModelSpec
qkv_bias): Qwen2 always (Qwen2Attention: bias=True on q_proj/k_proj/v_proj, bias=False on
o_proj; Qwen2Config has no key for it), Qwen2-MoE by this key (Qwen2MoeConfig, default true)."""
ATTENTION_BIAS = ("llama", "qwen3", "gemma", "gemma2", "qwen3_moe")
"""Families whose `attention_bias` (default false) biases q_proj, k_proj, v_proj AND o_proj
(LlamaAttention, Qwen3Attention, GemmaAttention, Gemma2Attention, Qwen3MoeAttention); Llama's
`mlp_bias` (default false) biases gate_proj, up_proj and down_proj (LlamaMLP). Mistral and
Mixtral build no bias whatever the file says; gpt-oss's are read in model_hf_moe."""


def _sliding_layers(cfg: dict[str, Any], where: str, kind: str, num_layers: int
                    ) -> tuple[int | None, int]:
    """The attention window transformers applies and on how many of the layers: the file's
    `layer_types` where it gives them (Mistral's ignore them), else the family's pattern
    (ALTERNATING_WINDOW, GATED_WINDOW, every layer); (None, 0) where none slides."""
    if kind in GATED_WINDOW and not _bool(cfg, where, "use_sliding_window", False):
        return None, 0
    window = cfg.get("sliding_window", SLIDING_WINDOW_BY_DEFAULT.get(kind))
    if window is None:
        return None, 0
    window = _int({"sliding_window": window}, where, "sliding_window")
    types = cfg.get("layer_types")
    if kind != "mistral" and isinstance(types, list):
        return window, sum(t == "sliding_attention" for t in types)
    if kind in GATED_WINDOW:
        first = cfg.get("max_window_layers", MAX_WINDOW_LAYERS)
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ConfigError(f"{where} max_window_layers", f"got {show(first)}",
                              "expected a non-negative integer")
        return window, max(0, num_layers - first)
    return window, (num_layers + 1) // 2 if kind in ALTERNATING_WINDOW else num_layers


def _softcaps(cfg: dict[str, Any], where: str, kind: str) -> dict[str, float]:
    """The logit soft-caps the model applies (SOFTCAPPING; Gemma 2's by default)."""
    caps = {}
    for key in SOFTCAPPING:
        value = cfg.get(key, SOFTCAPPING_BY_DEFAULT.get(kind, {}).get(key))
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value > 0):
            raise ConfigError(f"{where} {key}", f"got {show(value)}",
                              "expected a positive number, or null")
        caps[key] = float(value)
    return caps


def _stated_biases(cfg: dict[str, Any], where: str, kind: str) -> tuple[bool, bool]:
    """(attention_bias, mlp_bias) of an ATTENTION_BIAS family's config, as transformers reads
    them (mlp_bias: Llama's alone)."""
    if kind not in ATTENTION_BIAS:
        return False, False
    mlp = kind == "llama" and _bool(cfg, where, "mlp_bias", False)
    return _bool(cfg, where, "attention_bias", False), mlp


def linear_biases(cfg: dict[str, Any], where: str, kind: str) -> tuple[bool, bool]:
    """ModelSpec (bias, qkv_bias) as the family's HF model builds its Linears: q, k and v
    alone for Qwen2 (QKV_BIAS_KEY), every Linear where attention_bias and mlp_bias are both
    set, q, k and v (qkv_bias) for attention_bias alone, whose o_proj biases
    unmodelled_biases names; none otherwise (gpt-oss: model_hf_moe)."""
    if kind in QKV_BIAS_KEY:
        key = QKV_BIAS_KEY[kind]
        return False, key is None or _bool(cfg, where, key, True)
    attention, mlp = _stated_biases(cfg, where, kind)
    return attention and mlp, attention and not mlp


def unmodelled_biases(cfg: dict[str, Any], where: str, kind: str, spec: ModelSpec
                      ) -> str | None:
    """The biases the config states that linear_biases could not give the spec (priced and
    trained without them: the parameter count leans low), and how many parameters; None when
    every stated bias is in the spec."""
    attention, mlp = _stated_biases(cfg, where, kind)
    layers, h = spec.num_layers, spec.hidden_size
    if attention and not mlp:
        return (f"attention_bias true: o_proj's biases ({layers} layers x {h} = {layers * h:,} "
                "parameters; priced and trained with q, k and v's alone, qkv_bias: the "
                "parameter count leans low)")
    if mlp and not attention:
        per = (2 if spec.gated_mlp else 1) * spec.ffn + h
        return (f"mlp_bias true: the MLP's biases ({layers} layers x {per} = {layers * per:,} "
                "parameters; priced and trained without them, as autoplan biases every Linear "
                "or q, k and v alone: the parameter count leans low)")
    return None


def unmodelled_attention(cfg: dict[str, Any], where: str, kind: str, spec: ModelSpec
                         ) -> str | None:
    """What the config's attention (and its Linears' biases) does that autoplan neither
    prices nor trains, and which way the estimate leans for it; None when nothing. A window no
    shorter than the training sequence changes nothing (every token already sees every
    earlier one)."""
    notes = []
    window, sliding = _sliding_layers(cfg, where, kind, spec.num_layers)
    if window is not None and sliding and spec.seq_len > window:
        notes.append(f"sliding_window {window} on {sliding} of {spec.num_layers} layers (priced "
                     f"as full causal attention over all {spec.seq_len} tokens: attention time, "
                     "and its memory under eager attention, lean high)")
    caps = _softcaps(cfg, where, kind)
    if caps:
        notes.append(f"{' and '.join(f'{k} {v:g}' for k, v in caps.items())} (priced without "
                     "the tanh caps: step time leans slightly low)")
    biases = unmodelled_biases(cfg, where, kind, spec)
    if biases is not None:
        notes.append(biases)
    if not notes:
        return None
    return f"not modelled: {'; '.join(notes)}; `autoplan train` runs without them too"
