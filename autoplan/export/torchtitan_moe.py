"""`--to torchtitan` for mixture-of-experts models: torchtitan's own Qwen3-MoE and DeepSeek-V3
flavors, expert parallelism and the router's load balancing.

Read from the released wheels (`pip download --no-deps torchtitan==0.2.2` / `==0.3.0`):
- flavors: torchtitan/models/qwen3/__init__.py (`qwen3_args` in 0.2.2, `qwen3_configs` in 0.3.0:
  "30B-A3B", "235B-A22B"; softmax router with route_norm, no shared experts) and
  torchtitan/models/deepseek_v3/__init__.py (`deepseekv3_args` / `deepseekv3_configs`: "16B",
  "236B", "671B"; MLA; 671B has the sigmoid, group-limited, route_scale 2.5 router). Llama 4
  (0.2.2 only; `llama4_args` 17bx16e / 17bx128e) and gpt-oss have no autoplan preset to match.
  config_registry functions (0.3.0): qwen3_30b_a3b, deepseek_v3_16b, deepseek_v3_671b.
- expert parallelism: 0.2.2 torchtitan/distributed/parallel_dims.py builds the sparse mesh
  ("pp", "dp_replicate", "efsdp", "ep", "etp") with efsdp = dp_shard * cp * tp / (etp * ep) and
  asserts etp == tp or etp == 1 when ep > 1; 0.3.0 drops etp (mesh "pp", "dp_replicate",
  "efsdp", "ep", efsdp = dp_shard * cp * tp / ep; routed experts are TP-sharded only when
  ep == 1, models/common/moe_sharding.py expert_param_placement_dense).
- load balancing: MoE `load_balance_coeff` (default 1e-3) is the step of the auxiliary-loss-free
  expert bias, b += coeff * sign(mean load - load) (components/optimizer.py); 0.2.2 updates it
  for deepseek_v3 only (build_optimizers_with_moe_load_balancing; qwen3 uses build_optimizers,
  so its bias stays 0), 0.3.0 for both (register_moe_load_balancing_hook) unless the coeff is
  None. Neither has an auxiliary loss or a token capacity on the standard all-to-all path.
- rank order: the sparse mesh's last dims are (ep, etp), so an EP group is ep ranks at stride
  etp, as autoplan's cost model places it (cost/comm.py members_per_node(etp, ep, ...)).
- MTP: 0.3.0 deepseek_v3 `model_registry(flavor, num_mtp_layers=n)` with `MTPLoss`
  (models/deepseek_v3/mtp.py), which refuses pp > 1 and cp > 1; 0.2.2 has no MTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.export.megatron_moe import megatron_hint
from autoplan.export.torchtitan_text import Converters, ModelLines, registry_call
from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind
from autoplan.plan import Plan, Precision
from autoplan.rope_scaling import (
    DEEPSEEK_V3_ROPE_SCALING,
    RopeScaling,
    same_rotation,
    scaling_words,
)

DEFAULT_BALANCE = 1e-3
"""torchtitan's MoE load_balance_coeff default (models/moe/moe.py MoEArgs, 0.2.2;
models/common/moe.py MoE.Config, 0.3.0)."""


@dataclass(frozen=True)
class MoeFlavor:
    """One torchtitan MoE flavor: its shape, its router and where torchtitan registers it."""

    family: str
    """torchtitan model name (TOML [model] name; Python module torchtitan.models.<family>)."""
    flavor: str
    base: str
    """config_registry function (0.3.0) the Python config starts from."""
    shape: tuple
    """(layers, hidden, heads, kv_heads, head_dim, vocab, experts, top_k, expert width, shared
    experts, dense layers, dense ffn or 0, MLA (q_lora or 0, kv_lora, rope, nope, v) or None)."""
    sigmoid: bool
    """score_func sigmoid (DeepSeek-V3) or softmax; route_norm is true in both flavors here."""
    groups: tuple[int, int] | None
    """(num_expert_groups, num_limited_groups) of group-limited routing, or None."""
    route_scale: float
    toml_bias_updates: bool
    """0.2.2 updates the expert bias (deepseek_v3) or leaves it at 0 (qwen3)."""
    rope_theta: float
    """The flavor's RoPE base (qwen3: 1e6, Qwen3's; deepseek_v3: 10000, DeepSeek-V3's)."""
    yarn: bool = False
    """The flavor rotates with DeepSeek-V3's YaRN (flavor_rope_scaling); qwen3's unscaled."""
    qk_norm: bool = False
    """The flavor normalises q and k per head (qwen3: Qwen3ModelArgs qk_norm True in 0.2.2,
    qk_norm=_qwen3_norm(head_dim) in 0.3.0's flavors)."""
    norm_eps: float = 1e-5
    """The flavor's RMSNorm epsilon (0.2.2 model args' norm_eps: qwen3 1e-6, deepseek_v3 1e-5;
    0.3.0: qwen3's _EPS 1e-6, deepseek_v3's RMSNorm.Config default 1e-5); no setting of either
    release changes it."""


MOE_FLAVORS = (
    # torchtitan/models/qwen3/__init__.py: dim 2048, 48 layers, 32 heads, 4 KV heads, head_dim
    # 128, vocab 151936, moe_inter_dim 768, 128 experts, top_k 8, no shared experts
    MoeFlavor("qwen3", "30B-A3B", "qwen3_30b_a3b",
              (48, 2048, 32, 4, 128, 151936, 128, 8, 768, 0, 0, 0, None),
              False, None, 1.0, False, 1e6, qk_norm=True, norm_eps=1e-6),
    # dim 4096, 94 layers, 64 heads, 4 KV heads, moe_inter_dim 1536, 128 experts, top_k 8
    MoeFlavor("qwen3", "235B-A22B", "qwen3_30b_a3b",
              (94, 4096, 64, 4, 128, 151936, 128, 8, 1536, 0, 0, 0, None),
              False, None, 1.0, False, 1e6, qk_norm=True, norm_eps=1e-6),
    # torchtitan/models/deepseek_v3/__init__.py 671B: dim 7168, 61 layers (3 dense of 18432),
    # 128 heads, vocab 129280, 256 experts of 2048 + 1 shared, top_k 8, MLA q_lora 1536,
    # kv_lora 512, rope 64, nope 128, v 128; sigmoid, 8 groups / 4, route_scale 2.5
    MoeFlavor("deepseek_v3", "671B", "deepseek_v3_671b",
              (61, 7168, 128, 128, None, 129280, 256, 8, 2048, 1, 3, 18432,
               (1536, 512, 64, 128, 128)),
              True, (8, 4), 2.5, True, 10000.0, yarn=True),
)
"""Flavors a model autoplan can describe may match. DeepSeek 16B/236B route with softmax and
route_norm false (gates not renormalised), which autoplan's router does not run."""


def _shape(model: ModelSpec) -> tuple | None:
    moe, mla = model.moe, model.mla
    if moe is None or moe.layer_freq != 1:
        return None
    dense = moe.first_dense_layers
    mla_key = None if mla is None else (mla.q_lora_rank or 0, mla.kv_lora_rank,
                                        mla.qk_rope_head_dim, mla.qk_nope_head_dim,
                                        mla.v_head_dim)
    return (model.num_layers, model.hidden_size, model.num_heads, model.kv_heads,
            None if mla is not None else model.head_dim or model.hidden_size // model.num_heads,
            model.vocab_size, moe.num_experts, moe.experts_per_token,
            moe.expert_ffn_hidden_size, moe.num_shared_experts, dense,
            model.ffn if dense else 0, mla_key)


def moe_flavor(model: ModelSpec) -> MoeFlavor | None:
    """The torchtitan MoE flavor whose shape the model has (the router is checked apart)."""
    m = model
    if (m.mlp, m.norm, m.position, m.bias, m.qkv_bias, m.tie_embeddings) != (
            MlpKind.SWIGLU, NormKind.RMSNORM, PositionKind.ROPE, False, False, False):
        return None
    shape = _shape(model)
    return next((f for f in MOE_FLAVORS if f.shape == shape), None)


def moe_reasons(plan: Plan, model: ModelSpec, fmt: str) -> list[str]:
    """What of a MoE/MLA plan torchtitan (0.2.2 TOML, 0.3.0 Python) cannot run as planned."""
    found = moe_flavor(model)
    if model.qkv_bias:  # Qwen2-MoE's: torchtitan's qwen3 and deepseek_v3 attention has none
        return ["model.qkv_bias: torchtitan's MoE models have no q, k and v biases; "
                + megatron_hint(model, "--add-qkv-bias")]
    if found is None:
        return [f"model {model.name} matches no torchtitan MoE flavor (qwen3 30B-A3B, "
                "235B-A22B; deepseek_v3 671B: same layers, widths, experts, top-k, shared and "
                "dense layers, MLA ranks and vocab); " + megatron_hint(model)]
    moe, p, why = model.moe, plan.parallel, []
    assert moe is not None
    if moe.router_aux_free != found.sigmoid:
        kind = "sigmoid aux-free" if found.sigmoid else "softmax"
        why.append(f"model.moe.router_aux_free={str(moe.router_aux_free).lower()}: torchtitan's "
                   f"{found.family} {found.flavor} routes with its {kind} router; set "
                   f"{str(found.sigmoid).lower()}")
    groups = None if moe.route_groups == 1 else (moe.route_groups, moe.groups_per_token)
    if groups != found.groups:
        want = (f"{found.groups[0]} groups, {found.groups[1]} per token" if found.groups
                else "all experts, no groups")
        why.append(f"model.moe.route_groups={moe.route_groups} "
                   f"route_groups_per_token={moe.route_groups_per_token}: torchtitan's "
                   f"{found.flavor} routes over {want} (num_expert_groups, num_limited_groups)")
    if moe.routed_scaling_factor != found.route_scale:
        why.append(f"model.moe.routed_scaling_factor={moe.routed_scaling_factor:g}: torchtitan's "
                   f"{found.flavor} scales gates by route_scale={found.route_scale:g}")
    if model.qk_norm != found.qk_norm:  # only qwen3's can differ: MLA takes no qk_norm
        why.append(f"model.qk_norm={str(model.qk_norm).lower()}: torchtitan's {found.family} "
                   f"{found.flavor} normalises q and k per head (Qwen3's QK-norm); set qk_norm "
                   "true, or " + megatron_hint(model))
    if model.rope_theta != found.rope_theta:
        why.append(f"model.rope_theta={model.rope_theta:g}: torchtitan's {found.family} "
                   f"{found.flavor} rotates by rope_theta={found.rope_theta:g}")
    why += _rope_reasons(model, found, fmt)
    if moe.capacity_factor is not None:
        why.append(f"model.moe.capacity_factor={moe.capacity_factor:g}: torchtitan's all-to-all "
                   "experts are dropless (no token capacity); set null")
    if moe.router_dtype != "fp32":
        why.append(f"model.moe.router_dtype={moe.router_dtype}: torchtitan computes the router "
                   "gate in float32 (autocast in TokenChoiceTopKRouter); use fp32")
    if fmt == "toml" and moe.router_aux_free and (
            moe.router_bias_update_rate != DEFAULT_BALANCE):
        why.append(f"model.moe.router_bias_update_rate={moe.router_bias_update_rate:g}: "
                   f"torchtitan <= 0.2.2 fixes load_balance_coeff at {DEFAULT_BALANCE:g} in the "
                   "flavor (use --torchtitan-format python)")
    if fmt == "toml" and plan.precision == Precision.FP8:
        # 0.2.2's float8 experts (quantize.grouped_mm.float8) are a prototype that needs a
        # torchao nightly build and asserts pp == 1 and cp == 1 (components/quantization/float8.py)
        why.append("precision fp8 with experts: torchtitan <= 0.2.2's float8 expert GEMMs are a "
                   "torchao-nightly prototype (use --torchtitan-format python, or export to "
                   "megatron)")
    why += _mtp_reasons(plan, model, fmt)
    why += _ep_reasons(plan, fmt)
    if fmt == "toml" and p.pp > 1 and found.family == "qwen3":
        why.append(f"pp={p.pp}: torchtitan <= 0.2.2 registers qwen3 without a pipelining "
                   "function (use --torchtitan-format python)")
    if fmt == "toml" and p.cp > 1 and found.family == "deepseek_v3":
        why.append(f"cp={p.cp}: torchtitan <= 0.2.2's deepseek_v3 {found.flavor} uses flex "
                   "attention, which its context parallelism refuses (use --torchtitan-format "
                   "python)")
    return why


FLAVOR_YARN_WINDOW = 4096
"""deepseek_v3's original_seq_len (0.2.2 DeepSeekV3ModelArgs; 0.3.0 the flavors' ComplexRoPE)."""


def flavor_rope_scaling(found: MoeFlavor, model: ModelSpec, fmt: str) -> RopeScaling | None:
    """The rotation torchtitan trains `model` with as `found`: deepseek_v3's is DeepSeek-V3's
    YaRN (0.3.0 models/deepseek_v3/__init__.py: ComplexRoPE scaling "yarn", rope_factor 40,
    beta_fast 32, beta_slow 1, original_seq_len 4096, truncate True, and the attention's
    mscale 1.0 multiplying its softmax scale by (0.1 ln 40 + 1)^2, cos/sin unscaled); 0.2.2
    applies it (frequencies and softmax scale alike) only when training.seq_len exceeds
    original_seq_len (model/model.py precompute_freqs_cis `if seqlen > args.original_seq_len`,
    Attention `if model_args.max_seq_len > model_args.original_seq_len`), so a 4096-token TOML
    job trains unscaled. qwen3 rotates unscaled."""
    if not found.yarn or (fmt == "toml" and model.seq_len <= FLAVOR_YARN_WINDOW):
        return None
    return DEEPSEEK_V3_ROPE_SCALING


def _rope_reasons(model: ModelSpec, found: MoeFlavor, fmt: str) -> list[str]:
    want = flavor_rope_scaling(found, model, fmt)
    if same_rotation(model.rope_scaling, want):
        return []
    where = f"torchtitan's {found.family} {found.flavor}"
    if found.yarn and fmt == "toml" and same_rotation(model.rope_scaling,
                                                      DEEPSEEK_V3_ROPE_SCALING):
        return [f"model.rope_scaling (DeepSeek-V3's YaRN) at seq_len {model.seq_len}: torchtitan "
                f"<= 0.2.2's {found.family} {found.flavor} applies its YaRN only past "
                f"original_seq_len {FLAVOR_YARN_WINDOW}, so it would train this model unscaled; "
                "use --torchtitan-format python (0.3.0 always scales), a longer seq_len, or "
                "drop rope_scaling"]
    when = (f" at seq_len {model.seq_len} (<= 0.2.2 scales past {FLAVOR_YARN_WINDOW} only)"
            if found.yarn and fmt == "toml" else "")
    return [f"model.rope_scaling: the model rotates with {scaling_words(model.rope_scaling)}, "
            f"{where} with {scaling_words(want)}{when}; {megatron_hint(model)}"]


def _mtp_reasons(plan: Plan, model: ModelSpec, fmt: str) -> list[str]:
    n, p = model.mtp_layers, plan.parallel
    if not n:
        return []
    if fmt == "toml":
        return [f"model.mtp_layers={n}: torchtitan <= 0.2.2 has no multi-token prediction "
                "(use --torchtitan-format python, or " + megatron_hint(model) + ")"]
    if p.pp > 1 or p.cp > 1:
        return [f"model.mtp_layers={n} with pp={p.pp} cp={p.cp}: torchtitan's MTP runs with "
                "pp 1 and cp 1 only (MTPDecoder.Config); " + megatron_hint(model)]
    return []


def _ep_reasons(plan: Plan, fmt: str) -> list[str]:
    """EP borrows ranks from dp_shard x cp x tp (never from HSDP replicas or pp); ETP is 1 or tp
    (0.2.2) or, in 0.3.0, 1 with EP and tp without."""
    p, why = plan.parallel, []
    shard = 1 if plan.zero_stage == 0 else p.shard_degree
    if p.ep > 1 and plan.zero_stage == 0:
        why.append(f"parallel.ep={p.ep} with zero_stage=0: torchtitan applies FSDP to every "
                   "model with ep > 1; use zero_stage 2 or 3")
    elif (shard * p.cp * p.tp) % (p.ep * (p.etp if p.ep > 1 else 1)):
        why.append(f"parallel.ep={p.ep} etp={p.etp}: torchtitan takes ep x etp ranks from "
                   f"data_parallel_shard_degree x cp x tp = {shard} x {p.cp} x {p.tp}, not from "
                   "HSDP replicas; choose ep x etp dividing it")
    if p.ep > 1:
        allowed = (1, p.tp) if fmt == "toml" else (1,)
        if p.etp not in allowed:
            why.append(f"parallel.etp={p.etp} with ep={p.ep}: torchtitan "
                       + ("<= 0.2.2 accepts etp 1 or tp" if fmt == "toml" else
                          ">= 0.3 has no expert tensor parallelism with ep > 1 (etp 1; 0.2.2's "
                          "TOML also takes etp = tp)")
                       + f"; set etp to {' or '.join(map(str, sorted(set(allowed))))}")
    elif p.etp != p.tp:
        why.append(f"parallel.etp={p.etp} with ep=1 and tp={p.tp}: torchtitan shards routed "
                   f"experts over the whole tp group without ep; set etp={p.tp}")
    return why


def moe_parallelism(plan: Plan, fmt: str) -> dict[str, Any]:
    """[parallelism] fields of the experts (0.3.0 has no expert_tensor_parallel_degree)."""
    p = plan.parallel
    out: dict[str, Any] = {"expert_parallel_degree": p.ep}
    if fmt == "toml":
        out["expert_tensor_parallel_degree"] = p.etp if p.ep > 1 else 1
    return out


def python_model_lines(model: ModelSpec, found: MoeFlavor,
                       converters: Converters | None = None) -> ModelLines:
    """The lines that set config.model_spec (and the MTP loss) in the Python config: the
    flavor, MTP depth, the converters (float8) and the load-balancing step on every MoE layer
    (no module-level lines: the flavor is torchtitan's own)."""
    moe = model.moe
    assert moe is not None
    imports = [f"from torchtitan.models.{found.family} import config_registry, model_registry",
               *(converters.imports if converters else [])]
    args = repr(found.flavor)
    if model.mtp_layers:
        args += f", num_mtp_layers={model.mtp_layers}"
    body = [f"    config.model_spec = {registry_call(args, converters)}"]
    if model.mtp_layers:
        imports += ["from torchtitan.models.common.config_utils import decoder_vocab_size",
                    "from torchtitan.models.deepseek_v3.mtp import MTPLoss"]
        body.append("    config.loss = MTPLoss.Config(global_vocab_size="
                    "decoder_vocab_size(config.model_spec))")
    coeff = moe.router_bias_update_rate if moe.router_aux_free else None
    if coeff != DEFAULT_BALANCE:  # None: no bias updates (autoplan's softmax router)
        body += ["    for layer in config.model_spec.model.layers:",
                 "        if layer.moe is not None:",
                 f"            layer.moe.load_balance_coeff = {coeff!r}"]
    return ModelLines(imports, [], body)
