"""Reading one value of a Hugging Face `config.json`, type-checked, with the family's HF default
where the file leaves it out: positive integers and booleans, the training sequence length, the
norms' epsilon and RoPE's base and scaling (whose original window is also the pre-training
context). Kept apart from model_hf, which builds the spec, so that model_hf_attention and
model_hf_moe read values the same way without importing the builder.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_spec import DEFAULT_ROPE_THETA, MAX_NORM_EPS
from autoplan.rope_scaling import (
    LLAMA3_ROPE_TYPE,
    REQUIRED_FIELDS,
    ROPE_FIELDS,
    YARN_ROPE_TYPE,
    RopeScaling,
)
from autoplan.yaml_io import show

log = logging.getLogger(__name__)

ROPE_THETA_BY_DEFAULT = {"mixtral": 1e6, "gpt_oss": 150000.0}
"""`rope_theta` when the file leaves it out, where the family's HF config class does not default
to 10000 (MixtralConfig: 1e6; GptOssConfig: 150000)."""
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
