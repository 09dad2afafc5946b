"""The norms of a Megatron-LM model, written and read back: their epsilon (--norm-epsilon) and
the per-head q and k norms (--qk-layernorm), which multi-head latent attention takes as its
latent norms instead. Megatron-DeepSpeed spells the epsilon --layernorm-epsilon and has no QK-norm.

Megatron-Core (megatron/core/transformer/transformer_config.py): `layernorm_epsilon`, flag
--norm-epsilon, default 1e-5, "for any LayerNorm/RMSNorm"; `qk_layernorm` applies the
--normalization norm to the query and key: SelfAttention builds q_layernorm and k_layernorm at
hidden_size_per_attention_head (per head, before the rotary embedding), MLASelfAttention its
q_layernorm and kv_layernorm on the latents (gpt_layer_specs: IdentityOp without the flag).
"""

from __future__ import annotations

import logging

from autoplan.errors import ConfigError
from autoplan.export.shell_args import Flags
from autoplan.model_spec import DEFAULT_NORM_EPS, MAX_NORM_EPS, ModelSpec

log = logging.getLogger(__name__)

EPS_FLAG = "--norm-epsilon"
MDS_EPS_FLAG = "--layernorm-epsilon"
"""Megatron-DeepSpeed's (megatron/arguments.py at f1feb88: type float, default 1e-5)."""
QK_FLAG = "--qk-layernorm"
MEGATRON_NORM_EPS = DEFAULT_NORM_EPS
"""Both forks' default epsilon (1e-5): a launch without the flag normalises at it."""


def norm_args(m: ModelSpec) -> list[str]:
    """--norm-epsilon always (whatever the default), --qk-layernorm for QK-norm and for latent
    attention, whose latent norms autoplan's MLA always has (DeepSeek-V3's q_a_layernorm and
    kv_a_layernorm)."""
    a = [f"{EPS_FLAG} {m.norm_eps!r}"]
    if m.qk_norm or m.mla is not None:
        a.append(QK_FLAG)
    return a


def launch_eps(f: Flags, flag: str = EPS_FLAG) -> float:
    """The epsilon the launch normalises at: `flag`'s value, else Megatron's default."""
    eps = f.number(flag, MEGATRON_NORM_EPS)
    if eps is None or not 0.0 < eps <= MAX_NORM_EPS:
        raise ConfigError(f"{f.what} {flag}", f"got {eps}",
                          f"expected a positive number up to {MAX_NORM_EPS:g}, e.g. 1e-05")
    return eps


def launch_qk_norm(f: Flags) -> bool:
    """The launch normalises q and k per head: --qk-layernorm without latent attention (with
    it, the flag builds MLA's latent norms), RMSNorm only (autoplan's QK-norm is Qwen3's)."""
    if not f.has(QK_FLAG) or f.has("--multi-latent-attention"):
        return False
    if f.text("--normalization", "LayerNorm") != "RMSNorm":
        raise ConfigError(f"{f.what} {QK_FLAG}", "with --normalization LayerNorm (q and k "
                          "LayerNorm-ed per head)", "autoplan normalises q and k with RMSNorm "
                          "(Qwen3's): import an RMSNorm run, or drop the flag to import it "
                          "without QK-norm")
    return True


def norm_fields(f: Flags) -> dict[str, object]:
    """ModelSpec norm_eps and qk_norm of the model the flags build; says when a latent
    attention launch builds no latent norms (autoplan's MLA has them: priced and trained with
    them)."""
    if f.has("--multi-latent-attention") and not f.has(QK_FLAG):
        say_no_latent_norms(f)
    return {"norm_eps": launch_eps(f), "qk_norm": launch_qk_norm(f)}


def say_no_latent_norms(f: Flags) -> None:
    log.warning("%s: --multi-latent-attention without %s builds no latent norms (Megatron's "
                "q_layernorm and kv_layernorm are IdentityOp without it); autoplan's MLA has "
                "them, as DeepSeek-V3 does: priced and trained with them (add %s if the run "
                "has them)", f.what, QK_FLAG, QK_FLAG)


def check_norms(f: Flags, model: ModelSpec, fix: str, eps_flag: str = EPS_FLAG,
                qk_norm_flag: bool = True) -> None:
    """--model's norms against the launch's: the epsilon it normalises at (`eps_flag`, absent:
    the default) and QK-norm (`qk_norm_flag` False: a fork without the flag, which builds
    none). A latent-attention launch without --qk-layernorm is said (norm_fields)."""
    eps = launch_eps(f, eps_flag)
    if eps != model.norm_eps:
        shown = f"{eps:g}" if eps_flag in f.flags else f"absent: the default {eps:g},"
        raise ConfigError(f"{f.what} {eps_flag}", f"{shown} but --model {model.name} "
                          f"normalises at {model.norm_eps:g}", f"add {eps_flag} "
                          f"{model.norm_eps!r} to the launch if it trains {model.name}, or {fix}")
    built = launch_qk_norm(f) if qk_norm_flag else False
    if model.mla is not None and qk_norm_flag and not f.has(QK_FLAG):
        say_no_latent_norms(f)
    if built == model.qk_norm:
        return
    if model.qk_norm:
        where = (f"add {QK_FLAG} to the launch (it trains {model.name} without its QK-norm), "
                 "or " if qk_norm_flag else "")
        raise ConfigError(f"{f.what} {QK_FLAG}", f"the launch does not normalise q and k per "
                          f"head, --model {model.name} does (qk_norm)", f"{where}{fix}")
    raise ConfigError(f"{f.what} {QK_FLAG}", f"the launch normalises q and k per head, --model "
                      f"{model.name} does not (qk_norm false)", fix)
