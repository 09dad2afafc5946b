"""Import of a local Hugging Face `config.json` into a ModelSpec (no network, no transformers).

Decoder-only families only: Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma 2, GPT-2, GPT-NeoX. Every
value is type-checked (no truthiness), encoder models are refused, and the training sequence
length is the model's pre-training context, not its longest supported window. The norms'
epsilon and Qwen3's per-head QK-norm are read too. Sliding-window
attention, logit soft-capping and biases a ModelSpec cannot hold (Llama's `attention_bias` or
`mlp_bias` alone) are not modelled: reading them warns, saying which way it leans.
"""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_spec import (
    DEFAULT_ROPE_THETA,
    MAX_NORM_EPS,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
)
from autoplan.rope_scaling import (
    LLAMA3_ROPE_TYPE,
    REQUIRED_FIELDS,
    ROPE_FIELDS,
    YARN_ROPE_TYPE,
    RopeScaling,
)
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
ROPE_THETA_BY_DEFAULT = {"mixtral": 1e6, "gpt_oss": 150000.0}
"""`rope_theta` when the file leaves it out, where the family's HF config class does not default
to 10000 (MixtralConfig: 1e6; GptOssConfig: 150000)."""
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
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
"""Families whose attention RMS-normalises q and k per head over head_dim before RoPE (ModelSpec
qk_norm): Qwen3Attention and Qwen3MoeAttention build q_norm and k_norm whatever the config says
(no key for it). Of the others none has it (Gemma 3 and OLMo 2, which do, are not read here;
OLMo 2's norms span the whole q and k width, not a head)."""
NORM_EPS_KEYS = {"gpt2": "layer_norm_epsilon", "gpt_neox": "layer_norm_eps"}
"""The config key of the norms' epsilon where it is not `rms_norm_eps` (every other family's)."""
NORM_EPS_BY_DEFAULT = {"mixtral": 1e-5, "gpt_oss": 1e-5, "gpt2": 1e-5, "gpt_neox": 1e-5}
"""The epsilon when the file leaves its key out, as each family's HF config class sets it
(MixtralConfig, GptOssConfig rms_norm_eps 1e-5; GPT2Config layer_norm_epsilon and
GPTNeoXConfig layer_norm_eps 1e-5); every other family's class (Llama, Mistral, Qwen2/3 and
their MoE, Gemma/Gemma 2, DeepSeek-V3) defaults rms_norm_eps to 1e-6 (transformers 5.25). The
released checkpoints state theirs: Llama 2/3 and Mistral 7B 1e-5, Qwen3 and DeepSeek-V3 1e-6."""
DEFAULT_SEQ_LEN = 8192
"""Training sequence length when the config does not state the pre-training context: Llama 3 /
3.1 (Dubey et al. 2024, sec. 3.4), Gemma 2 (Gemma Team 2024, sec. 3) and Mistral 7B pre-train
on 8192-token sequences; the longer `max_position_embeddings` of Llama 3.1 (131072) or Qwen
(32768-40960) come from a later long-context stage. `--seq-len` overrides it."""


def _int(cfg: dict[str, Any], where: str, *names: str, default: int | None = None) -> int:
    """The first of `names` the config sets, as a positive integer (bools and strings refused)."""
    for name in names:
        value = cfg.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{where} {name}", f"got {show(value)}", "expected a positive integer")
        return value
    if default is not None:
        return default
    raise ConfigError(where, f"no {' or '.join(names)} in the config", "is this a decoder config?")


def _bool(cfg: dict[str, Any], where: str, name: str, default: bool) -> bool:
    value = cfg.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{where} {name}", f"got {show(value)} ({type(value).__name__})",
                          "expected JSON true or false")
    return value


def _stated_window(cfg: dict[str, Any], where: str) -> int | None:
    """The pre-training window rope_scaling states (original_max_position_embeddings), if any."""
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("original_max_position_embeddings") is not None:
        return _int(scaling, f"{where} rope_scaling", "original_max_position_embeddings")
    return None


def training_seq_len(cfg: dict[str, Any], where: str) -> int:
    """The pre-training context: rope_scaling's original window, else max_position_embeddings
    capped at DEFAULT_SEQ_LEN."""
    window = _stated_window(cfg, where)
    if window is not None:
        return window
    return min(_int(cfg, where, "max_position_embeddings", default=DEFAULT_SEQ_LEN),
               DEFAULT_SEQ_LEN)


def _capped_context(cfg: dict[str, Any], kind: str) -> int | None:
    """max_position_embeddings where training_seq_len planned for DEFAULT_SEQ_LEN tokens instead
    (the config states no pre-training window), else None; read after _build checked it."""
    if kind == "gpt2" or _stated_window(cfg, "config.json") is not None:
        return None  # GPT-2's learned table is its context; rope_scaling states the window
    longest = cfg.get("max_position_embeddings")
    return longest if isinstance(longest, int) and longest > DEFAULT_SEQ_LEN else None


@functools.cache
def _warn_capped(path: str, longest: int) -> None:
    """Say once per file and process that the sequence length is a guess, however many times a
    process loads the file (a plan's model is read again from its path wherever a caller has
    only the plan)."""
    log.warning("%s: max_position_embeddings %d; planning for %d-token training sequences "
                "(pass --seq-len to change)", path, longest, DEFAULT_SEQ_LEN)


def _rope_theta(cfg: dict[str, Any], where: str, kind: str) -> float:
    """The RoPE base: `rope_theta` (GPT-NeoX's older files: `rotary_emb_base`; transformers 5:
    `rope_parameters.rope_theta`), else the family's default. rope_scaling: _rope_scaling."""
    params = cfg.get("rope_parameters")
    found = [(f"{where} {name}", value) for name, value in (
        ("rope_theta", cfg.get("rope_theta")), ("rotary_emb_base", cfg.get("rotary_emb_base")),
        ("rope_parameters.rope_theta",
         params.get("rope_theta") if isinstance(params, dict) else None)) if value is not None]
    if not found:
        return ROPE_THETA_BY_DEFAULT.get(kind, DEFAULT_ROPE_THETA)
    key, value = found[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(key, f"got {show(value)}", "expected a positive number")
    return float(value)


def _rope_scaling(cfg: dict[str, Any], where: str) -> RopeScaling | None:
    """The scaling the file states (`rope_scaling` with rope_type, or the older `type`;
    transformers 5: `rope_parameters`): Llama 3.1's "llama3" or YaRN's "yarn", else None. Other
    kinds (linear, dynamic, longrope) are not modelled: the model rotates without them, and a
    warning says so."""
    key = "rope_scaling"
    scaling = cfg.get(key)
    if scaling is None and isinstance(cfg.get("rope_parameters"), dict):
        key, scaling = "rope_parameters", cfg["rope_parameters"]
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ConfigError(f"{where} {key}", f"got {show(scaling)}", "expected a JSON object or null")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind not in (LLAMA3_ROPE_TYPE, YARN_ROPE_TYPE):
        _warn_unmodelled_scaling(where, key, show(kind))
        return None
    fields = _yarn_fields(cfg, scaling) if kind == YARN_ROPE_TYPE else _llama3_fields(scaling)
    required = REQUIRED_FIELDS[kind]
    missing = [f for f in required if fields.get(f) is None]
    if missing:
        raise ConfigError(f"{where} {key}", f"rope_type {kind} without {', '.join(missing)}",
                          f"give all {len(required)} of " + ", ".join(required))
    try:  # an absent (or null) optional field takes RopeScaling's default, as transformers'
        return RopeScaling(rope_type=kind, **{k: v for k, v in fields.items() if v is not None})
    except ConfigError as err:  # say which file and key, not the ModelSpec field
        raise ConfigError(f"{where} {key}.{err.field.rsplit('.', 1)[-1]}", err.problem,
                          err.fix) from None


def _llama3_fields(scaling: dict[str, Any]) -> dict[str, Any]:
    """All four, REQUIRED_FIELDS (transformers' _validate_llama3_parameters)."""
    return {f: scaling.get(f) for f in ROPE_FIELDS[LLAMA3_ROPE_TYPE]}


def _yarn_fields(cfg: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    """YaRN's fields as transformers reads them (_compute_yarn_parameters and
    standardize_rope_params): the original window defaults to max_position_embeddings, an
    absent or 0 beta to 32 / 1 (`beta_fast or 32`), an mscale of 0 counts as none
    (`if mscale and mscale_all_dim`), truncate to true."""
    out = {f: scaling.get(f) for f in ROPE_FIELDS[YARN_ROPE_TYPE]}
    if out["original_max_position_embeddings"] is None:
        out["original_max_position_embeddings"] = cfg.get("max_position_embeddings")
    for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if out[name] == 0 and not isinstance(out[name], bool):
            out[name] = None
    return out


@functools.cache
def _warn_unmodelled_scaling(where: str, key: str, kind: str) -> None:
    log.warning("%s: %s rope_type %s is not modelled; autoplan rotates without it "
                "(Llama 3.1's \"llama3\" and YaRN's \"yarn\" are)", where, key, kind)


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


@functools.cache
def _warn_unmodelled(path: str, note: str) -> None:
    """Say once per file and process what the config's attention does that is not modelled."""
    log.warning("%s: %s", path, note)


def norm_eps(cfg: dict[str, Any], where: str, kind: str) -> float:
    """The norms' epsilon: `rms_norm_eps` (GPT-2's `layer_norm_epsilon`, GPT-NeoX's
    `layer_norm_eps`), else the family's HF default (NORM_EPS_BY_DEFAULT, else 1e-6)."""
    key = NORM_EPS_KEYS.get(kind, "rms_norm_eps")
    value = cfg.get(key)
    if value is None:
        return NORM_EPS_BY_DEFAULT.get(kind, 1e-6)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 < value <= MAX_NORM_EPS):
        raise ConfigError(f"{where} {key}", f"got {show(value)}",
                          f"expected a positive number up to {MAX_NORM_EPS:g} (e.g. 1e-06)")
    return float(value)


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
