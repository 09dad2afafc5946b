"""Read Megatron-LM `pretrain_gpt.py` arguments (a file of flags, or a launch script with them)
into plan fields and, unless --model is given, a model spec.

Only flags that decide a plan field are read; the rest (data, logging) are skipped and named
in a warning, but a misspelling of one we read is refused. Settings a plan cannot represent
(partial optimizer offload, mismatched dropouts, SGD) are errors.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Collection
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.megatron import NULL_TOKENIZER_EXTRA
from autoplan.export.megatron_moe import (
    MLA_YARN_FLAGS,
    MOE_SWITCHES,
    expert_degrees,
    moe_fields,
    yarn_scaling,
)
from autoplan.export.megatron_neutral import (
    NEUTRAL_SWITCHES,
    POSITIONS,
    check_positions,
    neutral_flags,
)
from autoplan.export.megatron_norms import check_norms, norm_fields
from autoplan.export.megatron_runtime import check_tp_overlap
from autoplan.export.megatron_te import ATTENTION_BACKENDS
from autoplan.export.shell_args import (
    Flags,
    expand_variables,
    launched_gpus,
    parse_flags,
    unread_flags,
)
from autoplan.hardware import DeviceSpec
from autoplan.model_spec import (
    DEFAULT_ROPE_THETA,
    PRESETS,
    YARN_ROPE_TYPE,
    ModelSpec,
    PositionKind,
    RopeScaling,
    load_model,
)
from autoplan.rope_scaling import same_rotation, scaling_words
from autoplan.yaml_io import show, to_dict

log = logging.getLogger(__name__)

SWITCHES = frozenset(
    {
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--optimizer-cpu-offload",
        "--use-precision-aware-optimizer",
        "--recompute-activations",
        "--bf16",
        "--fp16",
        "--grad-reduce-in-bf16",
        "--accumulate-allreduce-grads-in-fp32",
        "--group-query-attention",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--qk-layernorm",
        "--tp-comm-overlap",
        "--use-torch-fsdp2",
        "--use-megatron-fsdp",
        "--torch-fsdp2-no-reshard-after-forward",
        "--standalone",
        "--no-python",
        "--use-rotary-position-embeddings",
        "--use-rope-scaling",
        "--cpu-offloading",
        "--distribute-saved-activations",
    }
) | MOE_SWITCHES | NEUTRAL_SWITCHES
"""store_true flags we read or may meet beside them (torchrun's); they take no value."""
_TORCHRUN = ("nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port",
             "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone",
             "max-restarts", "monitor-interval", "start-method", "role", "module", "no-python",
             "run-path", "log-dir", "redirects", "tee", "local-ranks-filter", "local-addr")
LAUNCHER_FLAGS = frozenset(f"--{name}" for name in _TORCHRUN) | frozenset(
    f"--{name.replace('-', '_')}" for name in _TORCHRUN)
"""torchrun's flags (torch/distributed/run.py), which it takes with dashes or underscores and
abbreviated (argparse's allow_abbrev): neither refused as a misspelling nor said skipped."""
READ_FLAGS = (SWITCHES - LAUNCHER_FLAGS - NEUTRAL_SWITCHES) | frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
    "--num-query-groups", "--seq-length", POSITIONS, "--vocab-size", "--tokenizer-type",
    "--make-vocab-size-divisible-by", "--normalization", "--norm-epsilon",
    "--position-embedding-type",
    "--rotary-base", "--rope-scaling-factor",
    "--attention-dropout", "--hidden-dropout", "--micro-batch-size", "--global-batch-size",
    "--optimizer", "--optimizer-offload-fraction", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--recompute-modules", "--cp-comm-type", "--fp8-format",
    "--attention-backend", "--transformer-impl", "--data-parallel-sharding-strategy",
    "--num-distributed-optimizer-instances", "--pipeline-model-parallel-layout",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    # megatron_moe.moe_fields and expert_degrees
    "--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk", "--moe-layer-freq",
    "--moe-shared-expert-intermediate-size", "--moe-router-dtype", "--moe-expert-capacity-factor",
    "--moe-router-score-function", "--moe-router-bias-update-rate", "--moe-router-num-groups",
    "--moe-router-group-topk", "--moe-router-topk-scaling-factor", "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--mtp-num-layers", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", *MLA_YARN_FLAGS,
})
"""Megatron-LM flags the importer reads: an unknown flag that misspells one of them is refused
(shell_args.unread_flags), where reading on would take that flag's default."""
UNREAD_NEIGHBOURS = frozenset({"--fp4-format", "--tp-comm-overlap-ag", "--tp-comm-overlap-rs"})
"""Megatron flags a misspelling away from one we read (--fp8-format, --tp-comm-overlap), never
refused (megatron/training/arguments.py; checked against Megatron-Core's config fields in the
tests)."""
BACKEND_ATTENTION = {v: k.value for k, v in ATTENTION_BACKENDS.items()} | {
    "flash": "flash", "auto": "flash", "local": "eager"}
"""Megatron-Core's AttnBackend (transformer/enums.py: flash, fused, unfused, local, auto) -> plan
attention: flash and cuDNN fused kernels keep no s x s scores; unfused and local do (and any
backend under --transformer-impl local: _attention)."""
TRANSFORMER_IMPLS = ("local", "transformer_engine", "inference_optimized")
"""--transformer-impl choices (megatron/training/arguments.py: local and transformer_engine, the
default; later releases add inference_optimized)."""
FP8_FORMATS = ("e4m3", "hybrid")
"""--fp8-format choices (_add_transformer_engine_args): FP8 GEMMs, a plan's precision fp8."""
GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
NORMALIZATIONS = {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm"}
"""Megatron's --recompute-granularity, --recompute-method and --normalization choices."""
MAX_LAYOUT_ITEMS = 2**16
"""Most items a --pipeline-model-parallel-layout may expand to (checked before expanding)."""


def choice(f: Flags, flag: str, choices: Collection[str], default: str | None) -> str | None:
    """A flag's value, refused unless it is one of Megatron's `choices`."""
    value = f.text(flag, default)
    if value is not None and value not in choices:
        raise ConfigError(f"{f.what} {flag}", f"got {show(value)}",
                          f"expected one of {', '.join(choices)}")
    return value


def positive(f: Flags, flag: str, default: int = 1) -> int:
    """A count flag (a parallel degree, a layer count, a divisor): a positive integer,
    `default` when absent."""
    value = f.integer(flag, default)
    if value is None or value < 1:
        raise ConfigError(f"{f.what} {flag}", f"got {value}", "expected a positive integer")
    return value


def _expanded_length(text: str, pattern: str) -> int:
    """Length of `text` once every `pattern` match (group 1 times group 2) is expanded."""
    total = len(text)
    for m in re.finditer(pattern, text):
        times = int(m.group(2)) if len(m.group(2)) <= 12 else MAX_LAYOUT_ITEMS + 1
        total += len(m.group(1)) * times - len(m.group(0))
    return total


def _expand(text: str, pattern: str, layout: str, what: str) -> str:
    if _expanded_length(text, pattern) > MAX_LAYOUT_ITEMS:
        raise ConfigError(what, f"layout {show(layout, 80)} expands past {MAX_LAYOUT_ITEMS} items",
                          "give one item per layer, e.g. Et*4|t*4L")
    return re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)


def parse_layout(layout: str, what: str) -> tuple[int, ...]:
    """Transformer layers per stage of a --pipeline-model-parallel-layout ('Et*3|t*4|tmL'); m
    (multi-token-prediction) items are --mtp-num-layers' modules, not stage layers."""
    text = re.sub(r"[\s,\\]", "", layout)
    while "(" in text:  # (group)*n -> group repeated n times
        new = _expand(text, r"\(([^()]*)\)\*(\d+)", layout, what)
        if new == text:
            raise ConfigError(what, f"cannot read layout {show(layout, 80)}",
                              "expected e.g. Et*4|t*4L")
        text = new
    stages = []
    for chunk in text.split("|"):
        expanded = _expand(chunk, r"([EtLm])\*(\d+)", layout, what)
        if set(expanded) - set("EtLm"):
            raise ConfigError(
                what,
                f"layout {show(layout, 80)} has items autoplan does not model",
                "only E, t, m and L",
            )
        stages.append(expanded.count("t"))
    return tuple(stages)


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


def _stages(f: Flags, layers: int, pp: int) -> dict[str, Any]:
    """The pipeline section: vpp, schedule and an uneven split when the flags give one."""
    split: tuple[int, ...] | None = None
    vpp = 1
    layout = f.text("--pipeline-model-parallel-layout")
    if layout is not None:
        split = parse_layout(layout, f"{f.what} --pipeline-model-parallel-layout")
        vpp = len(split) // pp if len(split) % pp == 0 else 0
        if vpp == 0:
            raise ConfigError(
                f.what,
                f"the layout has {len(split)} stages, not a multiple of pp={pp}",
                "check --pipeline-model-parallel-layout",
            )
    elif f.integer("--num-layers-per-virtual-pipeline-stage") is not None:
        if _ends(f) != (None, None):  # Megatron's validate_args asserts the same
            raise ConfigError(f"{f.what} --num-layers-per-virtual-pipeline-stage",
                              "given with --decoder-first/last-pipeline-num-layers",
                              "give the virtual stages as --num-virtual-stages-per-pipeline-rank")
        per = f.integer("--num-layers-per-virtual-pipeline-stage") or 1
        vpp = layers // (pp * per) if layers % (pp * per) == 0 else 0
        if vpp == 0:
            raise ConfigError(
                f.what,
                f"{layers} layers do not split into pp={pp} ranks of {per}-layer virtual stages",
                "check the virtual pipeline flags",
            )
    else:
        vpp = f.integer("--num-virtual-stages-per-pipeline-rank", 1) or 1
        if pp > 1 and _ends(f) != (None, None):
            split = _first_last_split(f, layers, pp, vpp)
    out: dict[str, Any] = {"schedule": "interleaved-1f1b" if vpp > 1 else "1f1b", "vpp": vpp}
    if split is not None:
        out["layers_per_stage"] = list(split)
    return out


def _ends(f: Flags) -> tuple[int | None, int | None]:
    """--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers."""
    return (f.integer("--decoder-first-pipeline-num-layers"),
            f.integer("--decoder-last-pipeline-num-layers"))


def _first_last_split(f: Flags, layers: int, pp: int, vpp: int) -> tuple[int, ...]:
    """Layers per stage, in model order, as Megatron-Core builds them from uneven first and
    last ranks (transformer_block.py get_num_layers_to_build): the first (last) rank holds its
    given count, the ranks between share the rest evenly, and each rank's count is split
    evenly over its vpp virtual stages; model stage v * pp + r is rank r's chunk v."""
    first, last = _ends(f)
    flags = "--decoder-first/last-pipeline-num-layers"
    given = (f"first {'unset' if first is None else first}, last "
             f"{'unset' if last is None else last} of {layers} layers on pp={pp}, vpp={vpp}")
    rest = layers - (first or 0) - (last or 0)
    ranks_between = pp - (first is not None) - (last is not None)
    if min(first or 0, last or 0, rest) < 0 or (ranks_between == 0 and rest != 0) \
            or (ranks_between > 0 and rest % ranks_between):
        raise ConfigError(f"{f.what} {flags}", f"got {given}",
                          "the layers the ends leave must split evenly over the ranks between")
    ranks = [rest // ranks_between if ranks_between else 0] * pp
    if first is not None:
        ranks[0] = first
    if last is not None:
        ranks[-1] = last
    if any(n % vpp for n in ranks):  # Megatron-Core asserts it too
        raise ConfigError(f"{f.what} {flags}", f"got {given}: ranks of {ranks} layers",
                          f"give each rank a multiple of vpp={vpp} layers")
    return tuple(n // vpp for _ in range(vpp) for n in ranks)


def _zero(f: Flags) -> int:
    if f.has("--use-torch-fsdp2"):  # FSDP2 reshards after forward (ZeRO-3) unless told not to
        return 2 if f.has("--torch-fsdp2-no-reshard-after-forward") else 3
    if f.has("--use-megatron-fsdp"):
        strategy = f.text("--data-parallel-sharding-strategy", "no_shard")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            raise ConfigError(
                f"{f.what} --data-parallel-sharding-strategy",
                f"got {strategy!r}",
                f"expected one of {', '.join(stages)}",
            )
        return stages[strategy]
    return 1 if f.has("--use-distributed-optimizer") else 0


def flag_values(text: str, name: str) -> list[str] | None:
    """The values of a list flag (argparse nargs='*', e.g. --recompute-modules core_attn mlp):
    the words after its last occurrence up to the next flag; None when it is absent."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    tokens, found = list(lexer), None
    for i, tok in enumerate(tokens):
        if tok == name or tok.startswith(name + "="):
            rest = [tok.partition("=")[2]] if "=" in tok else []
            for word in tokens[i + 1:] if "=" not in tok else []:
                if word.startswith("--"):
                    break
                rest.append(word)
            found = rest
    return found


def _recompute(f: Flags, modules: list[str] | None = None) -> dict[str, Any]:
    granularity = choice(f, "--recompute-granularity", GRANULARITIES, None)
    if granularity is None and f.has("--recompute-activations"):
        granularity = "selective"  # Megatron: --recompute-activations means selective
    if granularity in (None, "selective"):
        out: dict[str, Any] = {"policy": granularity or "none", "num_layers": None}
        # Megatron-Core's default recompute_modules is [core_attn]: what plain selective means
        if granularity == "selective" and modules and modules != ["core_attn"]:
            out["modules"] = modules  # the plan's loader checks the names
        return out
    method = choice(f, "--recompute-method", RECOMPUTE_METHODS, None)
    count = f.integer("--recompute-num-layers")
    if method == "uniform" and count is not None and count > 1:  # groups of count layers
        return {"policy": "full", "num_layers": count, "method": "uniform"}
    # block: that many layers per stage; uniform by 1 (or none): every layer, one at a time.
    return {"policy": "full", "num_layers": count if method == "block" else None}


CP_COMM_TYPES = ("p2p", "all_gather", "allgather", "a2a", "a2a+p2p")
"""--cp-comm-type's values (megatron/training/arguments.py: nargs='+', one for all layers or one
per layer; default p2p). Megatron passes them to Transformer Engine's cp_comm_type, which takes
all_gather (what `export --to megatron` writes); Megatron's help spells it allgather."""


def _refuse_unplanned(f: Flags, cp: int, text: str) -> None:
    """Megatron settings a plan cannot say, refused rather than priced as something else:
    all-to-all context parallelism (a2a, a2a+p2p: Ulysses-style head scattering; autoplan plans
    and prices the ring, p2p or allgather, as the DeepSpeed importer refuses Ulysses), an
    optimizer other than Adam (the cost model prices Adam's 12 bytes of state per parameter),
    and Transformer Engine's --cpu-offloading of layers' activations and weights."""
    kinds = flag_values(expand_variables(text), "--cp-comm-type") or ["p2p"]
    for kind in kinds:
        if kind not in CP_COMM_TYPES:
            raise ConfigError(f"{f.what} --cp-comm-type", f"got {show(kind)}",
                              f"expected one of {', '.join(CP_COMM_TYPES)}")
    if cp > 1 and any(kind.startswith("a2a") for kind in kinds):
        raise ConfigError(f"{f.what} --cp-comm-type", f"{' '.join(kinds)}: all-to-all "
                          "context parallelism", "autoplan plans ring context parallelism: "
                          "import the run with --cp-comm-type p2p or all_gather")
    refuse_non_adam(f"{f.what} --optimizer", f.text("--optimizer", "adam") or "adam")
    if f.has("--cpu-offloading"):
        raise ConfigError(f"{f.what} --cpu-offloading", "offloads layers' activations and "
                          "weights to the host, which a plan cannot say", "drop it to import "
                          "the run without it (its activations then priced on the GPU)")


def refuse_non_adam(where: str, optimizer: str, adam: Collection[str] = ("adam",),
                    fold_case: bool = False) -> None:
    """Refuse an optimizer the cost model does not price: it prices Adam's states (fp32 master
    weights and two moments, 12 bytes per parameter). `adam`: the launcher's names for Adam
    (Megatron's --optimizer adam; DeepSpeed's types, whose case it folds: `fold_case`)."""
    if (optimizer.lower() if fold_case else optimizer) not in adam:
        raise ConfigError(where, f"got {show(optimizer)}", "autoplan prices Adam's states "
                          "(12 bytes per parameter): import an Adam run")


def _distributed_checkpoints(f: Flags, tp: int, recompute: dict[str, Any], sp: bool) -> None:
    """--distribute-saved-activations, as Megatron takes it: validate_args asserts tp > 1 and
    full recompute granularity with a --recompute-method, and TransformerConfig raises with
    sequence parallelism; where it runs, it splits each checkpointed block input over the
    tensor-parallel ranks, which a plan cannot say (said: priced whole)."""
    flag = f"{f.what} --distribute-saved-activations"
    if tp == 1 or recompute["policy"] != "full" or f.text("--recompute-method") is None:
        raise ConfigError(flag, f"with tp={tp} and {recompute['policy']} recompute",
                          "Megatron takes it only with tp > 1, --recompute-granularity full "
                          "and a --recompute-method: drop it")
    if sp:
        raise ConfigError(flag, "with --sequence-parallel", "Megatron refuses the two "
                          "together (sequence parallelism already splits those inputs): drop it")
    say_priced_whole(flag, tp)


def say_priced_whole(setting: str, tp: int) -> None:
    """Say that a run's split of its checkpointed block inputs over the tensor-parallel ranks
    (Megatron's --distribute-saved-activations, DeepSpeed's partition_activations), which a
    plan cannot carry, is priced without it."""
    log.warning("%s: priced without it (each checkpointed block input whole on every one of "
                "the %d tensor-parallel ranks): the plan's memory is high by (tp - 1)/tp of "
                "those inputs", setting, tp)


def megatron_plan_dict(
    text: str, model_ref: Any, num_gpus: int | None, what: str,
    device: DeviceSpec | None = None,
) -> dict[str, Any]:
    """Plan fields (and an inline model unless `model_ref`) from Megatron arguments; `device`:
    the GPU the run is imported for, which settles --attention-backend auto."""
    f = Flags(parse_flags(expand_variables(text), SWITCHES), what)
    # a misspelled flag is refused before the flag it means is read as its default
    unread_flags(f, READ_FLAGS, LAUNCHER_FLAGS | UNREAD_NEIGHBOURS, "Megatron")
    tp, pp = positive(f, "--tensor-model-parallel-size"), positive(f, "--pipeline-model-parallel-size")
    cp = positive(f, "--context-parallel-size")
    num_gpus = launched_gpus(f, num_gpus, "--nnodes", ("--nproc-per-node", "--nproc_per_node"))
    if num_gpus is None:
        raise ConfigError("--num-gpus", "missing", "the arguments do not fix the GPU count")
    if num_gpus % (tp * pp * cp):
        raise ConfigError(
            "--num-gpus",
            f"{num_gpus} is not a multiple of tp*pp*cp = {tp * pp * cp}",
            "check the GPU count",
        )
    dp = num_gpus // (tp * pp * cp)
    if model_ref is None:
        found = re.search(r"for model (\S+),", text)
        fields = model_fields(f, found.group(1) if found else "megatron-import")
        preset = PRESETS.get(fields["name"])
        model_ref = fields["name"] if preset == load_model(dict(fields)) else fields
    else:
        gqa = f.has("--group-query-attention")
        named = load_model(model_ref)
        check_model(f, named, tp,
                    "--num-query-groups" if gqa else "--group-query-attention", query_groups(f))
        check_norms(f, named, "drop --model to read the model from the arguments")
        _check_rope(f, named)
    spec = load_model(model_ref)
    layers = spec.num_layers
    check_positions(f, spec.position == PositionKind.LEARNED, spec.hidden_size)
    fraction = f.number("--optimizer-offload-fraction", 1.0)
    if f.has("--optimizer-cpu-offload") and fraction != 1.0:
        raise ConfigError(
            f"{what} --optimizer-offload-fraction",
            f"got {fraction}",
            "autoplan models offloading all optimizer states (1.0)",
        )
    _refuse_unplanned(f, cp, text)
    check_tp_overlap(f, tp, f.has("--sequence-parallel"))  # the runtime it picks: importers
    recompute = _recompute(f, flag_values(expand_variables(text), "--recompute-modules"))
    if f.has("--distribute-saved-activations"):
        _distributed_checkpoints(f, tp, recompute, sequence_parallel(f, tp))
    mb = f.need("--micro-batch-size", "add it (Megatron needs one; --model gives no batch)")
    return {
        "model": model_ref,
        "cluster": {"num_gpus": num_gpus},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, **expert_degrees(f, tp),
                     **_hsdp(f, dp)},
        "sequence_parallel": sequence_parallel(f, tp),
        "pipeline": _stages(f, layers, pp),
        "zero_stage": _zero(f),
        "offload": {"optimizer": f.has("--optimizer-cpu-offload"), "params": False},
        "recompute": recompute,
        "batch": {
            "micro_batch_size": mb,
            "global_batch_size": f.integer("--global-batch-size", mb * dp),
        },
        "precision": _precision(f),
        "attention": _attention(f, device),
        "grad_reduce_dtype": "bf16" if f.has("--grad-reduce-in-bf16") else
        "fp32" if f.has("--accumulate-allreduce-grads-in-fp32") else None,
    }


CORE_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads",
              "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
              "--micro-batch-size", "--global-batch-size", "--seq-length")
"""The flags every pretrain_gpt.py launch gives, named where a file holds none it reads."""


def check_megatron_arguments(text: str, path: str) -> None:
    """Refuse a file holding none of the Megatron-LM flags the importer reads (READ_FLAGS,
    torchrun's aside): another tool's script (an sbatch of `autoplan train`, say), which read
    on would be refused for something it never said (its "missing" RoPE scaling beside
    --model), not for being no Megatron launch."""
    flags = megatron_flags(text, f"megatron arguments {path}").flags
    if any(name in READ_FLAGS and name not in LAUNCHER_FLAGS for name in flags):
        return
    found = [name for name in flags if name not in LAUNCHER_FLAGS][:6]
    has = f"; its flags ({' '.join(found)}) are none of them" if found else ""
    fix = "give the pretrain_gpt.py launch script, or a file of its arguments"
    trained = re.search(r"(?:^|\s)autoplan\s+train\s+(\S+)", text)
    if trained:  # an exported autoplan job: the plan it trains is the plan
        from autoplan.export.kubernetes import PLAN_ENV, PLAN_FILE

        plan = trained.group(1).strip("'\"")
        if plan == PLAN_FILE:  # a pod's path: the manifest carries the plan in an env var
            fix += (f" (this Kubernetes manifest runs `autoplan train` on the plan it carries "
                    f"in {PLAN_ENV}: that plan needs no import; save it to a file and "
                    "`autoplan estimate --plan FILE` prices it)")
        else:
            fix += (f" (this file runs `autoplan train {plan}`: that plan needs no import; "
                    f"`autoplan estimate --plan {plan}` prices it)")
    raise ConfigError(f"FILE {path}", "no Megatron-LM arguments found: it holds none of those "
                      f"the import reads ({', '.join(CORE_FLAGS)}, ...){has}", fix)


def ignored_rope_flags(text: str, what: str) -> list[str]:
    """Sentences on the RoPE flags in `text` Megatron ignores, read here as it reads them:
    --rope-scaling-factor without --use-rope-scaling (RotaryEmbedding scales only under the
    switch: the model rotates unscaled), --use-rope-scaling with multi-latent attention, and
    any of them on a learned-position model (no rotary embedding is built)."""
    f = Flags(parse_flags(expand_variables(text), SWITCHES), what)
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


def megatron_flags(text: str, what: str) -> Flags:
    """The launch's flags as the importer reads them (variables expanded, switches known)."""
    return Flags(parse_flags(expand_variables(text), SWITCHES), what)


def unread_megatron_flags(text: str, what: str) -> list[str]:
    """The Megatron flags in `text` the importer skips (data, logging, ...); torchrun's are
    not Megatron's to say."""
    f = Flags(parse_flags(expand_variables(text), SWITCHES), what)
    unread = unread_flags(f, READ_FLAGS | neutral_flags(f), LAUNCHER_FLAGS | UNREAD_NEIGHBOURS,
                          "Megatron")
    return [name for name in unread if name not in LAUNCHER_FLAGS]


def _attention(f: Flags, device: DeviceSpec | None = None) -> str:
    """Plan attention of --attention-backend under --transformer-impl: the local spec
    (gpt_layer_specs.get_gpt_layer_local_spec) builds Megatron-Core's own unfused
    DotProductAttention, full s x s scores, whatever the backend says. `auto` (the default) is
    Transformer Engine's pick: a fused kernel, or unfused on a GPU older than Ampere, where its
    fused backends do not run (runtime_rules.fused_attention_on)."""
    backend = choice(f, "--attention-backend", BACKEND_ATTENTION, "auto")
    if choice(f, "--transformer-impl", TRANSFORMER_IMPLS, "transformer_engine") == "local":
        return "eager"
    if backend == "auto" and device is not None:
        from autoplan.cost.runtime_rules import fused_attention_on
        from autoplan.cost.runtimes import load_runtime

        if not fused_attention_on(load_runtime("megatron"), device):
            return "eager"
    return BACKEND_ATTENTION[str(backend)]


def _precision(f: Flags) -> str:
    """--bf16 / --fp16 / neither (fp32); --fp8-format in a bf16 run: fp8 GEMMs."""
    check_one_precision(f)
    if choice(f, "--fp8-format", FP8_FORMATS, None) is None:
        return "bf16" if f.has("--bf16") else "fp16" if f.has("--fp16") else "fp32"
    if not f.has("--bf16"):
        raise ConfigError(f"{f.what} --fp8-format", "without --bf16",
                          "autoplan plans fp8 GEMMs in a bf16 run (precision fp8); add --bf16")
    return "fp8"


def check_one_precision(f: Flags) -> None:
    """Refuse --fp16 with --bf16: validate_args asserts `not args.bf16` under --fp16 (Megatron-LM
    megatron/training/arguments.py; Megatron-DeepSpeed megatron/arguments.py likewise)."""
    if f.has("--fp16") and f.has("--bf16"):
        raise ConfigError(f"{f.what} --fp16", "given with --bf16",
                          "keep one of them: Megatron refuses both")


def sequence_parallel(f: Flags, tp: int) -> bool:
    """--sequence-parallel, which validate_args turns off at tp=1 (with a warning in
    Megatron-LM; silently in Megatron-DeepSpeed): there is no tensor-parallel group to split
    the sequence over."""
    if f.has("--sequence-parallel") and tp == 1:
        log.warning("%s: --sequence-parallel at tp=1 is off, as Megatron turns it off",
                    f.what)
        return False
    return f.has("--sequence-parallel")


def _hsdp(f: Flags, dp: int) -> dict[str, Any]:
    """--num-distributed-optimizer-instances N (N copies of the distributed optimizer, each
    sharded over dp / N ranks, gradients all-reduced across copies): HSDP's dp_shard = dp / N."""
    n = f.integer("--num-distributed-optimizer-instances", 1) or 1
    if n == 1:
        return {}
    if n < 1 or dp % n:
        raise ConfigError(f"{f.what} --num-distributed-optimizer-instances", f"got {n}",
                          f"expected a divisor of the data-parallel size {dp}")
    return {"dp_shard": dp // n}


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
