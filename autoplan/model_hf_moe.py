"""Import of mixture-of-experts Hugging Face configs: Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3
(with multi-head latent attention) and gpt-oss. The dense parts are read as `autoplan.model_hf`
reads Llama; a layer pattern or feature autoplan cannot express is refused with one line.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_hf import _llama_like
from autoplan.model_hf_values import _bool, _int
from autoplan.model_spec import ModelSpec
from autoplan.moe_spec import MLASpec, MoESpec
from autoplan.yaml_io import show

MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss")
"""model_type values this module reads (transformers' MixtralConfig, Qwen2MoeConfig,
Qwen3MoeConfig, DeepseekV3Config, GptOssConfig)."""


def _qwen_layers(cfg: dict[str, Any], where: str, num_layers: int) -> tuple[int, int]:
    """(first_dense_layers, layer_freq) of Qwen2/3-MoE: block i is sparse when i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step == 0 (Qwen2MoeDecoderLayer), i.e. blocks
    step-1, 2*step-1, ...: first_dense_layers = step - 1, layer_freq = step."""
    step = _int(cfg, where, "decoder_sparse_step", default=1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                             for i in only):
        raise ConfigError(f"{where} mlp_only_layers", f"got {show(only)}",
                          "expected a list of layer indices")
    if only and (step != 1 or sorted(only) != list(range(len(only)))):
        raise ConfigError(f"{where} mlp_only_layers", f"got {show(only)}",
                          "autoplan models dense layers only as the leading ones "
                          "(0, 1, ..., k-1) with decoder_sparse_step 1")
    if step > num_layers:
        raise ConfigError(f"{where} decoder_sparse_step", f"{step} exceeds the {num_layers} "
                          "layers", "no block would be MoE: import it as a dense model")
    return (len(only), 1) if only else (step - 1, step)


def _moe_of(cfg: dict[str, Any], where: str, kind: str, num_layers: int) -> tuple[MoESpec, int]:
    """The MoESpec and the dense MLP width of each family."""
    if kind in ("mixtral", "gpt_oss"):
        ffn = _int(cfg, where, "intermediate_size")
        spec = MoESpec(_int(cfg, where, "num_local_experts", "num_experts"),
                       _int(cfg, where, "num_experts_per_tok", "experts_per_token"), ffn)
        return spec, ffn
    if kind in ("qwen2_moe", "qwen3_moe"):
        width = _int(cfg, where, "moe_intermediate_size")
        shared = 0
        if kind == "qwen2_moe" and cfg.get("shared_expert_intermediate_size"):
            total = _int(cfg, where, "shared_expert_intermediate_size")
            if total % width:
                raise ConfigError(f"{where} shared_expert_intermediate_size",
                                  f"{total} is not a multiple of moe_intermediate_size={width}",
                                  "autoplan models shared experts of the routed width")
            shared = total // width
        first, freq = _qwen_layers(cfg, where, num_layers)
        spec = MoESpec(_int(cfg, where, "num_experts"), _int(cfg, where, "num_experts_per_tok"),
                       width, num_shared_experts=shared, first_dense_layers=first,
                       layer_freq=freq)
        return spec, _int(cfg, where, "intermediate_size", default=width)
    # deepseek_v3: block i is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0
    # (DeepseekV3DecoderLayer); that is autoplan's (i - k) % freq == 0 when freq divides k
    first = cfg.get("first_k_dense_replace", 0)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ConfigError(f"{where} first_k_dense_replace", f"got {show(first)}",
                          "expected a non-negative integer")
    freq = _int(cfg, where, "moe_layer_freq", default=1)
    if first % freq:
        raise ConfigError(f"{where} moe_layer_freq", f"{freq} does not divide "
                          f"first_k_dense_replace={first}", "autoplan cannot express this pattern")
    spec = MoESpec(_int(cfg, where, "n_routed_experts"), _int(cfg, where, "num_experts_per_tok"),
                   _int(cfg, where, "moe_intermediate_size"),
                   num_shared_experts=_int(cfg, where, "n_shared_experts", default=0) if
                   cfg.get("n_shared_experts") else 0,
                   first_dense_layers=first, layer_freq=freq, **_deepseek_router(cfg, where))
    return spec, _int(cfg, where, "intermediate_size")


DEEPSEEK_ROUTER = {"topk_method": "noaux_tc", "scoring_func": "sigmoid",
                   "norm_topk_prob": True}
"""The only DeepSeek-V3 router autoplan runs (the deepseek-ai/DeepSeek-V3 config.json's keys;
transformers' DeepseekV3TopkRouter implements this one alone): absent keys read as these."""


def _deepseek_router(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """MoESpec routing fields of a deepseek_v3 config. n_group, topk_group and
    routed_scaling_factor default to transformers' DeepseekV3Config (8, 4, 2.5)."""
    for key, want in DEEPSEEK_ROUTER.items():
        got = cfg.get(key, want)
        if got != want or type(got) is not type(want):
            raise ConfigError(f"{where} {key}", f"got {show(got)}", "autoplan runs DeepSeek-V3's "
                              "router alone: topk_method noaux_tc, scoring_func sigmoid, "
                              "norm_topk_prob true")
    groups = _int(cfg, where, "n_group", default=8)
    per = _int(cfg, where, "topk_group", default=4)
    scale = cfg.get("routed_scaling_factor", 2.5)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ConfigError(f"{where} routed_scaling_factor", f"got {show(scale)}",
                          "expected a number")
    if groups == 1 and per != 1:
        raise ConfigError(f"{where} topk_group", f"{per} with n_group 1",
                          "one group has no subset to choose: set topk_group 1")
    return {"router_aux_free": True, "route_groups": groups,
            "route_groups_per_token": per if groups > 1 else None,
            "routed_scaling_factor": float(scale)}


def _mla_of(cfg: dict[str, Any], where: str) -> MLASpec:
    q_rank = cfg.get("q_lora_rank")
    return MLASpec(
        kv_lora_rank=_int(cfg, where, "kv_lora_rank"),
        qk_rope_head_dim=_int(cfg, where, "qk_rope_head_dim"),
        qk_nope_head_dim=_int(cfg, where, "qk_nope_head_dim"),
        v_head_dim=_int(cfg, where, "v_head_dim"),
        q_lora_rank=None if q_rank is None else _int(cfg, where, "q_lora_rank"))


def _mtp_layers(cfg: dict[str, Any], where: str) -> int:
    """Multi-token-prediction depth: `num_nextn_predict_layers` (DeepseekV3Config; the
    deepseek-ai/DeepSeek-V3 config.json sets 1, README_WEIGHTS.md), 0 when absent."""
    value = cfg.get("num_nextn_predict_layers", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where} num_nextn_predict_layers", f"got {show(value)}",
                          "expected a non-negative integer")
    return value


def from_moe_config(cfg: dict[str, Any], where: str, name: str, kind: str) -> ModelSpec:
    """A ModelSpec with `moe` (and for DeepSeek-V3 `mla`) from a config of MOE_FAMILIES."""
    base = _llama_like(cfg, where, name, kind)
    spec, ffn = _moe_of(cfg, where, kind, base.num_layers)
    if spec.first_dense_layers >= base.num_layers:
        raise ConfigError(f"{where} first dense layers", f"{spec.first_dense_layers} of "
                          f"{base.num_layers} layers", "no block would be MoE")
    changes: dict[str, Any] = {"moe": spec, "ffn_hidden_size": ffn}
    if kind == "gpt_oss":  # attention (q, k, v, o) and experts carry biases (GptOssAttention)
        changes["bias"] = _bool(cfg, where, "attention_bias", True)
    if kind == "deepseek_v3":
        if _bool(cfg, where, "attention_bias", False):  # DeepseekV3Config's, default false
            raise ConfigError(f"{where} attention_bias", "true", "autoplan models DeepSeek-V3's "
                              "latent attention without biases (the released model has none)")
        mla = _mla_of(cfg, where)
        changes.update(mla=mla, num_kv_heads=base.num_heads,
                       head_dim=(mla.qk_head_dim + mla.v_head_dim) // 2,
                       mtp_layers=_mtp_layers(cfg, where))
    return base.replace(**changes)
