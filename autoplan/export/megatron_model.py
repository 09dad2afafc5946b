"""The model a Megatron-LM launch builds, read from its shape flags, or --model checked against
them: widths, heads, vocabulary, norms, biases and RoPE (MoE and MLA: megatron_moe)."""

from __future__ import annotations

import re
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.megatron import NULL_TOKENIZER_EXTRA
from autoplan.export.megatron_args import choice, megatron_flags, positive
from autoplan.export.megatron_moe import moe_fields, yarn_scaling
from autoplan.export.megatron_norms import check_norms, norm_fields
from autoplan.export.shell_args import Flags
from autoplan.model_spec import (
    DEFAULT_ROPE_THETA,
    PRESETS,
    YARN_ROPE_TYPE,
    ModelSpec,
    RopeScaling,
    load_model,
)
from autoplan.rope_scaling import same_rotation, scaling_words
from autoplan.yaml_io import to_dict

NORMALIZATIONS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
"""Megatron's --normalization choices, and the model norm each builds."""


def launch_model(f: Flags, model_ref: Any, text: str, tp: int) -> Any:
    """The plan's model: `model_ref` (--model), checked against the shape flags, else the model
    they build, by its preset's name where it is one (named by a `for model NAME,` comment)."""
    if model_ref is None:
        found = re.search(r"for model (\S+),", text)
        fields = model_fields(f, found.group(1) if found else "megatron-import")
        preset = PRESETS.get(fields["name"])
        return fields["name"] if preset == load_model(dict(fields)) else fields
    gqa = f.has("--group-query-attention")
    named = load_model(model_ref)
    check_model(f, named, tp,
                "--num-query-groups" if gqa else "--group-query-attention", query_groups(f))
    check_norms(f, named, "drop --model to read the model from the arguments")
    _check_rope(f, named)
    return model_ref


def ffn_size(f: Flags) -> int | None:
    """The MLP width Megatron builds: --ffn-hidden-size, else validate_args' default from
    --hidden-size (4h; with --swiglu, 8h/3 rounded down to a multiple of 64; the same in
    Megatron-DeepSpeed's validate_args); None when neither is given."""
    ffn, hidden = f.integer("--ffn-hidden-size"), f.integer("--hidden-size")
    if ffn is not None or hidden is None:
        return ffn
    return int(4 * hidden * 2 / 3 / 64) * 64 if f.has("--swiglu") else 4 * hidden


def query_groups(f: Flags) -> int | None:
    """Megatron-LM's key/value heads: under --group-query-attention, --num-query-groups, whose
    default is 1 (megatron/training/arguments.py, _add_network_size_args); without it, one per
    attention head. None when the flags give no head count."""
    if f.has("--group-query-attention"):
        return f.integer("--num-query-groups", 1)
    return f.integer("--num-attention-heads")


def launch_vocab(f: Flags) -> int | None:
    """The vocabulary --vocab-size gives the model: NullTokenizer adds one EOD token."""
    vocab = f.integer("--vocab-size")
    if vocab is not None and f.text("--tokenizer-type") == "NullTokenizer":
        vocab += NULL_TOKENIZER_EXTRA
    return vocab


NEED = "add it, or pass --model"
"""What to do about a missing model-shape flag: the importer builds the model from them."""


def model_fields(f: Flags, name: str) -> dict[str, Any]:
    """A model spec mapping from the model-shape flags."""
    hidden, heads = f.need("--hidden-size", NEED), f.need("--num-attention-heads", NEED)
    swiglu = f.has("--swiglu")
    vocab = launch_vocab(f)
    if vocab is None:
        raise ConfigError(
            f.what,
            "no --vocab-size (the tokenizer file decides it)",
            "pass --model, or add --vocab-size",
        )
    attn_drop = f.number("--attention-dropout", 0.1)  # Megatron's defaults
    hidden_drop = f.number("--hidden-dropout", 0.1)
    if attn_drop != hidden_drop:
        raise ConfigError(
            f.what,
            f"--attention-dropout {attn_drop} != --hidden-dropout {hidden_drop}",
            "autoplan models one dropout; pass --model",
        )
    return {
        "name": name,
        "num_layers": f.need("--num-layers", NEED),
        "hidden_size": hidden,
        "num_heads": heads,
        "head_dim": f.integer("--kv-channels"),
        "num_kv_heads": query_groups(f),
        "ffn_hidden_size": ffn_size(f),
        "vocab_size": vocab,
        "seq_len": f.need("--seq-length", NEED),
        "mlp": "swiglu" if swiglu else "gelu",
        "norm": NORMALIZATIONS[str(choice(f, "--normalization", NORMALIZATIONS, "LayerNorm"))],
        "position": _position(f),
        **_rope_theta(f),
        **_rope_scaling(f),
        **launch_biases(f),
        **norm_fields(f),  # --norm-epsilon, --qk-layernorm
        "tie_embeddings": not f.has("--untie-embeddings-and-output-weights"),
        "dropout": hidden_drop,
        **moe_fields(f, f.need("--num-layers", NEED)),  # experts and latent attention, if any
    }


def launch_biases(f: Flags) -> dict[str, bool]:
    """ModelSpec bias (and qkv_bias where set) of the model the flags build: every Linear biased
    unless --disable-bias-linear; --add-qkv-bias puts q, k and v's back (Megatron-Core's
    linear_qkv: bias=add_bias_linear or add_qkv_bias; Megatron-DeepSpeed has no such flag)."""
    if not f.has("--disable-bias-linear"):
        return {"bias": True}
    return {"bias": False, **({"qkv_bias": True} if f.has("--add-qkv-bias") else {})}


def _position(f: Flags) -> str:
    if f.has("--use-rotary-position-embeddings"):  # validate_args: position_embedding_type rope
        return "rope"
    kind = f.text("--position-embedding-type", "learned_absolute")
    if kind not in ("learned_absolute", "rope"):
        raise ConfigError(
            f"{f.what} --position-embedding-type",
            f"got {kind!r}",
            "autoplan models learned_absolute or rope",
        )
    return "rope" if kind == "rope" else "learned"


def _rope_theta(f: Flags) -> dict[str, Any]:
    """rope_theta from --rotary-base (Megatron's default 10000) for a RoPE model; a learned-
    position model ignores the flag, as Megatron's embedding does."""
    if _position(f) != "rope":
        return {}
    theta = f.integer("--rotary-base")
    return {"rope_theta": DEFAULT_ROPE_THETA if theta is None else float(theta)}


def _rope_scaling(f: Flags) -> dict[str, Any]:
    """rope_scaling from --use-rope-scaling (Llama 3.1's, in the band Megatron-Core fixes,
    RopeScaling's defaults) and --rope-scaling-factor (default 8), or MLA's YaRN
    (megatron_moe.yarn_scaling); none without them, or for a learned-position model, whose
    embedding Megatron does not rotate."""
    built = _built_scaling(f)
    if built is None:
        return {}
    if built.rope_type == YARN_ROPE_TYPE:
        return {"rope_scaling": {k: v for k, v in to_dict(built).items() if v is not None}}
    return {"rope_scaling": {"factor": built.factor}}


def _check_rope(f: Flags, named: ModelSpec) -> None:
    """--model must rotate as the launch does: at the base of --rotary-base (Megatron's default
    10000 when absent) and with the scaling of --use-rope-scaling or MLA's YaRN flags, compared
    by effect (rope_scaling.same_rotation: a file may spell YaRN's mscales otherwise)."""
    built = _rope_theta(f).get("rope_theta")  # the base Megatron rotates by
    if built is not None and built != named.rope_theta:
        shown = (f"{built:g}" if f.has("--rotary-base")
                 else f"absent: Megatron's default {built:g},")
        raise ConfigError(f"{f.what} --rotary-base", f"{shown} but --model {named.name} has "
                          f"{named.rope_theta:g}", "drop --model to read the model from "
                          "the arguments, or give a model file at that base")
    built_scaling = _built_scaling(f)
    if not same_rotation(built_scaling, named.rope_scaling):  # by effect, not by spelling
        yarn = YARN_ROPE_TYPE in (getattr(built_scaling, "rope_type", None),
                                  getattr(named.rope_scaling, "rope_type", None))
        flag = "--rotary-scaling-factor" if yarn else "--use-rope-scaling"
        raise ConfigError(f"{f.what} {flag}", f"the launch rotates with "
                          f"{scaling_words(built_scaling)}, --model {named.name} with "
                          f"{scaling_words(named.rope_scaling)}", "drop --model to read the "
                          "model from the arguments, or give a model file that scales as the "
                          "launch does")


def _built_scaling(f: Flags) -> RopeScaling | None:
    """The RoPE scaling the launch builds (see _rope_scaling), its factor checked as a flag."""
    if _position(f) != "rope":
        return None
    if f.has("--multi-latent-attention") or not f.has("--use-rope-scaling"):
        return yarn_scaling(f)  # MLA builds its own rotary embedding (ignored_rope_flags)
    try:
        return RopeScaling(factor=f.number("--rope-scaling-factor", 8.0))
    except ConfigError as err:
        raise ConfigError(f"{f.what} --rope-scaling-factor", err.problem, err.fix) from None


def ignored_rope_flags(text: str, what: str) -> list[str]:
    """Sentences on the RoPE flags in `text` Megatron ignores, read here as it reads them:
    --rope-scaling-factor without --use-rope-scaling (RotaryEmbedding scales only under the
    switch: the model rotates unscaled), --use-rope-scaling with multi-latent attention, and
    any of them on a learned-position model (no rotary embedding is built)."""
    f = megatron_flags(text, what)
    given = [flag for flag in ("--rotary-base", "--use-rope-scaling", "--rope-scaling-factor")
             if flag in f.flags]
    if _position(f) != "rope":
        return [f"{' '.join(given)} ignored, as Megatron ignores them: learned positions "
                "rotate nothing (--position-embedding-type rope rotates)"] if given else []
    if f.has("--use-rope-scaling") and f.has("--multi-latent-attention"):
        return ["--use-rope-scaling ignored, as Megatron-Core ignores it with "
                "--multi-latent-attention (GPTModel scales its rotary embedding only without "
                "MLA; MLA's own rotates by --rope-type and --rotary-scaling-factor)"]
    if "--rope-scaling-factor" in f.flags and not f.has("--use-rope-scaling"):
        return [f"--rope-scaling-factor {f.text('--rope-scaling-factor')} without "
                "--use-rope-scaling ignored, as Megatron ignores it: the model rotates "
                "unscaled (add --use-rope-scaling if the run scales)"]
    return []


def _bias_words(bias: bool, qkv_bias: bool) -> str:
    return "every linear bias" if bias else "q, k and v biases alone" if qkv_bias else "no bias"


def _check_biases(f: Flags, model: ModelSpec, fix: str) -> None:
    """Where --model or the launch has q, k and v biases alone, the other has them too
    (launch_biases): a Qwen2 model launched with --disable-bias-linear alone would train
    without them. A launch biasing every Linear for a model biasing none (or the reverse) is
    let through, as it was before qkv_bias."""
    built = launch_biases(f)
    bias, qkv = built["bias"], built.get("qkv_bias", False)
    if (qkv or model.qkv_bias) and (bias, qkv) != (model.bias, model.qkv_bias):
        flag = "--add-qkv-bias" if not (bias or model.bias) else "--disable-bias-linear"
        if model.qkv_bias and not qkv and not bias:  # the launch lacks the model's biases
            fix = (f"add --add-qkv-bias to the launch (it trains {model.name} without its q, k "
                   f"and v biases), or {fix}")
        raise ConfigError(f"{f.what} {flag}", f"the launch builds {_bias_words(bias, qkv)}, "
                          f"--model {model.name} has {_bias_words(model.bias, model.qkv_bias)}",
                          fix)


def padded_vocab_size(vocab: int, f: Flags, tp: int) -> int:
    """The vocabulary Megatron builds: padded up to a multiple of --make-vocab-size-divisible-by
    (default 128) times tp (_vocab_size_with_padding in megatron/training/tokenizer/
    tokenizer.py; megatron/tokenizer/tokenizer.py in Megatron-DeepSpeed)."""
    multiple = positive(f, "--make-vocab-size-divisible-by", 128) * tp
    return -(-vocab // multiple) * multiple


def check_model(f: Flags, model: ModelSpec, tp: int, kv_flag: str, kv_heads: int | None,
                fix: str = "drop --model to read the model from the arguments") -> None:
    """--model wins over the shape flags, but only when they describe the model Megatron builds
    from them; `kv_heads`: the key/value heads the launcher's flags give (None: they give no head
    count), `kv_flag` the flag a mismatch names.

    The vocabularies are compared as Megatron pads them: the plan prices the model's padded
    vocabulary (cost/params.padded_vocab), so a --vocab-size that pads to the same rows builds
    the same embedding and output layer (a tokenizer with a few extra tokens is no mistake),
    and one that pads to other rows is a different model, smaller or larger."""
    shape = {
        "--num-layers": (f.integer("--num-layers"), model.num_layers),
        "--hidden-size": (f.integer("--hidden-size"), model.hidden_size),
        "--num-attention-heads": (f.integer("--num-attention-heads"), model.num_heads),
        "--seq-length": (f.integer("--seq-length"), model.seq_len),
        "--ffn-hidden-size": (ffn_size(f), model.ffn),
    }
    for flag, (given, value) in shape.items():
        if given is not None and given != value:
            raise ConfigError(f"{f.what} {flag}", f"{given} but --model {model.name} has "
                              f"{value}", fix)
    if kv_heads is not None and kv_heads != model.kv_heads:
        raise ConfigError(f"{f.what} {kv_flag}", f"{kv_heads} key/value heads but --model "
                          f"{model.name} has {model.kv_heads}", fix)
    _check_biases(f, model, fix)
    vocab = launch_vocab(f)
    if vocab is None:
        return
    from autoplan.cost.params import padded_vocab

    built, priced = padded_vocab_size(vocab, f, tp), int(padded_vocab(model, tp))
    if built != priced:
        raise ConfigError(f"{f.what} --vocab-size", f"{vocab} pads to {built} rows at tp={tp} "
                          f"but --model {model.name}'s {model.vocab_size} pads to {priced}", fix)
