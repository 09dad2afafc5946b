"""Megatron-LM flags for mixture-of-experts and multi-head latent attention, both ways.

`moe_args` writes them for `export --to megatron`; `moe_fields` reads them back for `import
--from megatron`. Spellings and types are those of megatron/training/arguments.py
(_add_moe_args, _add_mla_args, _add_network_size_args) at NVIDIA/Megatron-LM 000c4ac24f
(tests/data/export/megatron_flags.yaml lists them).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.rope_scaling import YARN_ROPE_TYPE, RopeScaling, field_words, yarn_mscale
from autoplan.yaml_io import show

log = logging.getLogger(__name__)

MOE_SWITCHES = frozenset({"--moe-grouped-gemm", "--moe-router-enable-expert-bias",
                          "--multi-latent-attention", "--moe-permute-fusion",
                          "--moe-shared-expert-overlap", "--overlap-moe-expert-parallel-comm",
                          "--moe-enable-deepep"})
"""store_true MoE/MLA flags (read as switches by the importer)."""
DISPATCHERS = ("allgather", "alltoall", "flex")
"""--moe-token-dispatcher-type choices (Megatron's default: allgather). A plan does not say its
dispatcher; the runtime traits do (RuntimeTraits.ep_dispatcher): the `megatron` preset prices
alltoall, `megatron-allgather` allgather, `megatron-deepep` flex on DeepEP."""
DISPATCHER_RUNTIME = {"allgather": "megatron-allgather", "alltoall": "megatron"}
"""The runtime preset that prices each dispatcher as Megatron runs it (flex: by its backend)."""


def moe_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What of a MoE plan Megatron-LM cannot run as planned."""
    moe, why = model.moe, list[str]()
    if moe is None:
        return why
    if plan.parallel.tp > 1 and not plan.sequence_parallel:
        why.append(f"tp={plan.parallel.tp} with experts and sequence_parallel false: Megatron "
                   "requires --sequence-parallel with tensor and expert parallelism; set it true")
    if moe.route_groups > 1 and moe.experts_per_token != 2 * moe.groups_per_token:
        # megatron/core/transformer/moe/moe_utils.py group_limited_topk scores a group by its
        # top-(topk // group_topk) scores; DeepSeek-V3 (and autoplan) by its top 2
        why.append(f"model.moe.route_groups={moe.route_groups} with experts_per_token="
                   f"{moe.experts_per_token} and route_groups_per_token="
                   f"{moe.groups_per_token}: Megatron scores a group by its top "
                   "experts_per_token / route_groups_per_token experts, DeepSeek-V3 by its "
                   "top 2; choose experts_per_token = 2 * route_groups_per_token")
    if moe.router_aux_free and moe.experts_per_token == 1:
        why.append("model.moe.router_aux_free with experts_per_token=1: Megatron leaves a "
                   "single sigmoid gate unnormalised (topk_routing_with_score_function), "
                   "DeepSeek-V3 normalises it to 1; route to 2 or more experts")
    if moe.router_dtype != "fp32":
        why.append(f"model.moe.router_dtype={moe.router_dtype}: Megatron's --moe-router-dtype "
                   "offers fp32 and fp64 (or the model's dtype when unset, which autoplan "
                   "cannot state); use fp32")
    return why


def layer_freq(model: ModelSpec) -> str:
    """--moe-layer-freq: N when block i is MoE exactly when i % N == 0 (Megatron's 1:N ratio),
    else the per-layer list of 1 (MoE) and 0 (dense)."""
    moe = model.moe
    assert moe is not None
    if moe.first_dense_layers == 0:
        return str(moe.layer_freq)
    pattern = [int(moe.is_moe_layer(i)) for i in range(model.num_layers)]
    if moe.layer_freq == 1:
        return f"([0]*{moe.first_dense_layers}+[1]*{model.num_layers - moe.first_dense_layers})"
    return "[" + ",".join(map(str, pattern)) + "]"


def moe_args(plan: Plan, model: ModelSpec) -> list[str]:
    """MoE, MLA and MTP flags of a plan `moe_reasons` accepted ([] for a dense model)."""
    a: list[str] = []
    if model.mtp_layers:  # DeepSeek-V3 §2.2; megatron/training/arguments.py network size args
        a.append(f"--mtp-num-layers {model.mtp_layers}")
    if model.mla is not None:
        mla = model.mla
        a.append("--multi-latent-attention")
        if mla.q_lora_rank is not None:
            a.append(f"--q-lora-rank {mla.q_lora_rank}")
        # Megatron's --qk-head-dim is the part without position (q_head_dim = it + pos part)
        a += [f"--kv-lora-rank {mla.kv_lora_rank}", f"--qk-head-dim {mla.qk_nope_head_dim}",
              f"--qk-pos-emb-head-dim {mla.qk_rope_head_dim}", f"--v-head-dim {mla.v_head_dim}"]
    moe = model.moe
    if moe is None:
        return a
    a += [f"--num-experts {moe.num_experts}", f"--moe-router-topk {moe.experts_per_token}",
          f"--moe-ffn-hidden-size {moe.expert_ffn_hidden_size}",
          f"--moe-layer-freq {layer_freq(model)}",
          f"--expert-model-parallel-size {plan.parallel.ep}",
          # Megatron's default expert TP is the model's TP: always say it
          f"--expert-tensor-parallel-size {plan.parallel.etp}",
          "--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall",
          f"--moe-router-dtype {moe.router_dtype}"]
    if moe.num_shared_experts:
        shared = moe.num_shared_experts * moe.expert_ffn_hidden_size
        a.append(f"--moe-shared-expert-intermediate-size {shared}")
    if moe.capacity_factor is not None:
        a.append(f"--moe-expert-capacity-factor {moe.capacity_factor}")
    if moe.router_aux_free:  # DeepSeek-V3 §2.1.2: sigmoid affinities plus a per-expert bias
        a += ["--moe-router-enable-expert-bias", "--moe-router-score-function sigmoid",
              f"--moe-router-bias-update-rate {moe.router_bias_update_rate:g}"]
    if moe.route_groups > 1:
        a += [f"--moe-router-num-groups {moe.route_groups}",
              f"--moe-router-group-topk {moe.groups_per_token}"]
    if moe.routed_scaling_factor != 1.0:  # applied after the gates' normalisation
        a.append(f"--moe-router-topk-scaling-factor {moe.routed_scaling_factor:g}")
    return a


def _freq_pattern(text: str, num_layers: int, what: str) -> tuple[int, int]:
    """(first_dense_layers, layer_freq) of a --moe-layer-freq value autoplan can express."""
    flat = re.sub(r"\s", "", text)
    if re.fullmatch(r"\d+", flat):
        return 0, max(int(flat), 1)
    found = re.fullmatch(r"\(?\[0\]\*(\d+)\+\[1\]\*(\d+)\)?", flat)
    if found and int(found.group(1)) + int(found.group(2)) == num_layers:
        return int(found.group(1)), 1
    items = re.fullmatch(r"\[([01](?:,[01])*)\]", flat)
    if items:
        bits = [int(b) for b in items.group(1).split(",")]
        first = bits.index(1) if 1 in bits else len(bits)
        for freq in range(1, num_layers + 1):
            want = [int(i >= first and (i - first) % freq == 0) for i in range(num_layers)]
            if bits == want:
                return first, freq
    raise ConfigError(f"{what} --moe-layer-freq", f"got {show(text, 80)}",
                      "autoplan models leading dense layers then every k-th layer MoE, "
                      "e.g. 1, 2 or ([0]*3+[1]*58)")


def moe_fields(f: Any, num_layers: int) -> dict[str, Any]:
    """`moe` and `mla` model fields from the flags (empty for a dense model). `f` is
    the launch's flags (shell_args.Flags)."""
    out: dict[str, Any] = {}
    depth = f.integer("--mtp-num-layers")
    if depth:  # multi-token prediction (None and 0: none)
        out["mtp_layers"] = depth
    if f.has("--multi-latent-attention"):
        out["mla"] = {"q_lora_rank": f.integer("--q-lora-rank"),
                      "kv_lora_rank": f.integer("--kv-lora-rank", 32),  # Megatron's defaults
                      "qk_nope_head_dim": f.integer("--qk-head-dim", 128),
                      "qk_rope_head_dim": f.integer("--qk-pos-emb-head-dim", 64),
                      "v_head_dim": f.integer("--v-head-dim", 128)}
        mla = out["mla"]
        out["head_dim"] = (mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
                           + mla["v_head_dim"]) // 2
    experts = f.integer("--num-experts")
    if experts is None:
        for flag in ("--moe-router-topk", "--expert-model-parallel-size", "--moe-ffn-hidden-size"):
            if f.text(flag) is not None:
                raise ConfigError(f"{f.what} {flag}", "given without --num-experts",
                                  "add --num-experts or drop the MoE flags")
        return out
    width = f.integer("--moe-ffn-hidden-size") or f.integer("--ffn-hidden-size")
    if width is None:
        raise ConfigError(f"{f.what} --moe-ffn-hidden-size", "missing",
                          "give each expert's width (or --ffn-hidden-size)")
    shared_total = f.integer("--moe-shared-expert-intermediate-size")
    if shared_total is not None and shared_total % width:
        raise ConfigError(f"{f.what} --moe-shared-expert-intermediate-size",
                          f"{shared_total} is not a multiple of the expert width {width}",
                          "autoplan models shared experts of the routed width")
    first, freq = _freq_pattern(f.text("--moe-layer-freq", "1") or "1", num_layers, f.what)
    dtype = f.text("--moe-router-dtype")
    if dtype not in (None, "fp32"):
        raise ConfigError(f"{f.what} --moe-router-dtype", f"got {show(dtype)}",
                          "autoplan models fp32 (or unset) routers")
    out["moe"] = _routing_fields(f) | {
        "num_experts": experts, "experts_per_token": f.integer("--moe-router-topk", 2),
        "expert_ffn_hidden_size": width,
        "num_shared_experts": 0 if shared_total is None else shared_total // width,
        "first_dense_layers": first, "layer_freq": freq,
        "capacity_factor": (f.number("--moe-expert-capacity-factor", 1.0)
                            if f.text("--moe-expert-capacity-factor") is not None else None),
    }
    return out


def _routing_fields(f: Any) -> dict[str, Any]:
    """router_aux_free, route_groups(_per_token), routed_scaling_factor and the bias update
    rate from Megatron's router flags. Megatron routes group-limited only when
    --moe-router-group-topk is set (moe_utils.topk_routing_with_score_function)."""
    aux_free = f.has("--moe-router-enable-expert-bias")
    score = f.text("--moe-router-score-function", "softmax")
    if aux_free != (score == "sigmoid"):
        raise ConfigError(f"{f.what} --moe-router-score-function", f"{score} with"
                          f"{'' if aux_free else 'out'} --moe-router-enable-expert-bias",
                          "autoplan models sigmoid scores with the expert bias (DeepSeek-V3) "
                          "and softmax without it")
    out: dict[str, Any] = {"router_aux_free": aux_free}
    rate = f.text("--moe-router-bias-update-rate")
    if rate is not None:
        out["router_bias_update_rate"] = f.number("--moe-router-bias-update-rate", 1e-3)
    per = f.integer("--moe-router-group-topk")
    if per is not None:
        groups = f.integer("--moe-router-num-groups", 1)
        out["route_groups"] = groups
        out["route_groups_per_token"] = None if groups == per == 1 else per
    scale = f.text("--moe-router-topk-scaling-factor")
    if scale is not None:
        out["routed_scaling_factor"] = f.number("--moe-router-topk-scaling-factor", 1.0)
    return out


def expert_degrees(f: Any, tp: int) -> dict[str, int]:
    """ep and etp (Megatron's default expert TP is the model's TP; 1 for a dense model)."""
    ep = f.integer("--expert-model-parallel-size", 1)
    etp = f.integer("--expert-tensor-parallel-size",
                    tp if f.integer("--num-experts") is not None else 1)
    for flag, value in (("--expert-model-parallel-size", ep),
                        ("--expert-tensor-parallel-size", etp)):
        if value is None or value < 1:
            raise ConfigError(f"{f.what} {flag}", f"got {value}", "expected a positive integer")
    dispatcher = f.text("--moe-token-dispatcher-type")
    if dispatcher is not None and dispatcher not in DISPATCHERS:
        raise ConfigError(f"{f.what} --moe-token-dispatcher-type", f"got {show(dispatcher)}",
                          f"expected one of {', '.join(DISPATCHERS)}")
    if f.integer("--num-experts") is not None and ep > 1:
        _tell_dispatcher_runtime(f, dispatcher or "allgather")
    return {"ep": ep, "etp": etp}


def dispatcher_runtime(f: Any) -> str | None:
    """The runtime preset that prices the launch's MoE token dispatcher: `megatron` (alltoall,
    or no expert parallelism to dispatch over), `megatron-allgather` (Megatron's default),
    `megatron-deepep` (flex on DeepEP); None for flex without DeepEP, which none prices."""
    if f.integer("--num-experts") is None or (f.integer("--expert-model-parallel-size", 1)
                                              or 1) < 2:
        return "megatron"
    dispatcher = f.text("--moe-token-dispatcher-type") or "allgather"
    if dispatcher == "flex":  # DeepEP by --moe-enable-deepep (2025) or the backend flag (2026;
        # HybridEP is a branch of DeepEP, its README says: one copy per destination node too)
        deepep = f.has("--moe-enable-deepep") or f.text("--moe-flex-dispatcher-backend") in (
            "deepep", "hybridep")
        return "megatron-deepep" if deepep else None
    return DISPATCHER_RUNTIME[dispatcher]


def _tell_dispatcher_runtime(f: Any, dispatcher: str) -> None:
    """The plan cannot carry the launch's token dispatcher (a runtime trait): say which
    `--runtime` prices it, unless it is the `megatron` preset's own alltoall."""
    given = "" if f.text("--moe-token-dispatcher-type") else " (Megatron's default)"
    runtime = dispatcher_runtime(f)
    if runtime == "megatron":
        return
    if runtime is None:
        log.warning("%s: --moe-token-dispatcher-type flex without DeepEP has no runtime preset: "
                    "estimate it with --runtime megatron (alltoall) or megatron-deepep", f.what)
        return
    log.warning("%s: MoE tokens dispatched by %s%s: estimate the plan with --runtime %s (the "
                "megatron runtime prices alltoall)", f.what, dispatcher, given, runtime)


MLA_YARN_FIXED: dict[str, Any] = {"original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "truncate": True}
"""YaRN fields Megatron-LM's MLA takes fixed: MLATransformerConfig's defaults (megatron-core
0.16.1 transformer/transformer_config.py: original_max_position_embeddings 4096, beta_fast 32,
beta_slow 1; MultiLatentAttention builds YarnRotaryEmbedding without
correction_range_round_to_int, default True), for which arguments.py at 000c4ac has no flag.
Its flags: --rope-type (rope or yarn; MLA's default yarn), --rotary-scaling-factor (default 1:
no scaling), --mscale (1) and --mscale-all-dim (0), _add_mla_args."""
MLA_YARN_FLAGS = ("--rope-type", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim")


def megatron_mscales(s: RopeScaling) -> tuple[float, float] | None:
    """(--mscale, --mscale-all-dim) under which Megatron-Core's MLA scales as `s` does: the
    softmax scale by _yarn_get_mscale(factor, mscale_all_dim)^2 (transformer/
    multi_latent_attention.py) and cos/sin by _yarn_get_mscale(factor, mscale) /
    _yarn_get_mscale(factor, mscale_all_dim) (_yarn_get_concentration_factor); None where no
    pair does (an attention_factor no positive mscale reaches)."""
    assert s.factor is not None
    all_dim = s.mscale_all_dim or 0.0
    if s.mscale and s.mscale_all_dim and s.attention_factor is None:  # HF's ratio: as given
        mscale = s.mscale
    elif s.factor <= 1.0:
        mscale = 1.0
    else:  # solve 0.1 mscale ln(factor) + 1 = attention_scaling * yarn_mscale(factor, all_dim)
        target = s.attention_scaling * yarn_mscale(s.factor, all_dim)
        mscale = round((target - 1.0) / (0.1 * math.log(s.factor)), 12)
    ok = (mscale > 0 and math.isclose(yarn_mscale(s.factor, all_dim) ** 2, s.softmax_gain)
          and math.isclose(yarn_mscale(s.factor, mscale) / yarn_mscale(s.factor, all_dim),
                           s.attention_scaling))
    return (mscale, all_dim) if ok else None


def megatron_hint(model: ModelSpec, flags: str = "") -> str:
    """The other targets' pointer to megatron: "export to megatron" (with its `flags`) where
    Megatron-LM runs the model's rotation, else why megatron refuses the model too: gpt-oss's
    YaRN without MLA was refused by every target, each sending the user to megatron, which
    refused it as well (rope_reasons, the one model-level refusal of the megatron export)."""
    why = rope_reasons(model)
    if not why:
        return "export to megatron" + (f" ({flags})" if flags else "")
    return (f"megatron refuses model {model.name} too ({why[0].split(':')[0]}): no framework "
            "target writes it as it stands; autoplan's own runtime trains it (--to torchrun, "
            "slurm or kubernetes)")


def rope_reasons(model: ModelSpec) -> list[str]:
    """What of a model's RoPE scaling Megatron-LM cannot run: YaRN without MLA (arguments.py
    core_transformer_config_from_args asserts 'Common attention only support rope_type="rope"';
    --position-embedding-type has no yarn), YaRN fields MLA fixes otherwise, and Llama 3.1's
    scaling with MLA (megatron-core 0.16.1 GPTModel builds the RotaryEmbedding that
    --use-rope-scaling scales only `if position_embedding_type == 'rope' and not
    multi_latent_attention`; MLA builds its own, unscaled under --rope-type rope)."""
    s = model.rope_scaling
    if s is None:
        return []
    if s.rope_type != YARN_ROPE_TYPE:
        return [] if model.mla is None else [
            f"model.rope_scaling: {s.describe()} with multi-latent attention: Megatron-Core's "
            "MLA builds its own rotary embedding and ignores --use-rope-scaling, so it would "
            "train unscaled; drop rope_scaling, or use YaRN (rope_type: yarn, MLA's "
            "--rope-type yarn)"]
    if model.mla is None:
        return ["model.rope_scaling yarn without multi-latent attention: Megatron-LM's arguments "
                "build YaRN for MLA only (common attention rotates by rope_type rope; "
                "Megatron-Bridge's position_embedding_type yarn is the route to it); drop "
                "rope_scaling to train it unscaled, or use another target"]
    fixed = {k: getattr(s, k) for k in MLA_YARN_FIXED}
    why = []
    if fixed != MLA_YARN_FIXED:
        why.append(f"model.rope_scaling {field_words(fixed)}: Megatron-Core's MLA fixes YaRN's "
                   f"{field_words(MLA_YARN_FIXED)} (MLATransformerConfig's defaults, no flag); "
                   "only the factor and the mscales are flags")
    if megatron_mscales(s) is None:
        why.append(f"model.rope_scaling (cos/sin x{s.attention_scaling:.4g}, softmax "
                   f"x{s.softmax_gain:.4g}): no --mscale / --mscale-all-dim pair scales "
                   "Megatron-Core's MLA so")
    return why


def yarn_args(model: ModelSpec) -> list[str]:
    """--rope-type yarn, the factor and the mscales, for an MLA model with YaRN that
    rope_reasons accepts; [] otherwise (MLA's default --rotary-scaling-factor 1 rotates
    unscaled)."""
    s = model.rope_scaling
    if model.mla is None or s is None or s.rope_type != YARN_ROPE_TYPE:
        return []
    scales = megatron_mscales(s)
    assert scales is not None
    return ["--rope-type yarn", f"--rotary-scaling-factor {s.factor!r}",
            f"--mscale {scales[0]!r}", f"--mscale-all-dim {scales[1]!r}"]


def yarn_scaling(f: Any) -> RopeScaling | None:
    """The YaRN an MLA launch rotates with (--rope-type yarn or absent, --rotary-scaling-factor
    above 1), MLA_YARN_FIXED's fields with it; None otherwise. The mscales read back as HF
    spells them: both (DeepSeek's), an attention_factor (--mscale alone), or neither."""
    if not f.has("--multi-latent-attention"):
        return None
    factor = f.number("--rotary-scaling-factor", 1.0)
    mscale, all_dim = f.number("--mscale", 1.0), f.number("--mscale-all-dim", 0.0)
    if f.text("--rope-type", "yarn") != "yarn":
        _refuse_unrotated_gain(f, factor, all_dim)
        return None
    if factor == 1.0:
        return None
    fields: dict[str, Any] = {}
    if all_dim:
        fields = {"mscale": mscale, "mscale_all_dim": all_dim}
    elif mscale != 1.0 and factor > 1.0:
        fields = {"attention_factor": yarn_mscale(factor, mscale)}
    try:
        return RopeScaling(rope_type=YARN_ROPE_TYPE, factor=factor, **MLA_YARN_FIXED, **fields)
    except ConfigError as err:
        flag = {"factor": "--rotary-scaling-factor", "mscale": "--mscale",
                "mscale_all_dim": "--mscale-all-dim"}.get(err.field.rsplit(".", 1)[-1], "--mscale")
        raise ConfigError(f"{f.what} {flag}", err.problem, err.fix) from None


def _refuse_unrotated_gain(f: Any, factor: float, all_dim: float) -> None:
    """--rope-type rope still scales MLA's softmax: megatron-core 0.16.1 MultiLatentAttention
    sets softmax_scale = _yarn_get_mscale(rotary_scaling_factor, mscale_all_dim)^2 / sqrt(d)
    whatever the rope_type, a gain no unscaled rotation of autoplan's has."""
    gain = yarn_mscale(factor, all_dim) ** 2  # 1 at --mscale-all-dim 0 (its default)
    if gain != 1.0:
        raise ConfigError(f"{f.what} --mscale-all-dim", f"{all_dim:g} with --rope-type rope "
                          f"and --rotary-scaling-factor {factor:g}: Megatron-Core's MLA still "
                          f"multiplies the softmax scale by {gain:.4g} while rotating unscaled, "
                          "which autoplan does not model", "drop --mscale-all-dim to train "
                          "unscaled, or use --rope-type yarn to train with YaRN")
