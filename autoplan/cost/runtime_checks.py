"""Strict checks of RuntimeTraits' field values, each refusal one line that names the field, the
value and the fix. Which plans a runtime can run is runtime_rules.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoplan.cost.runtime_kinds import (
    ATTENTION_KERNELS,
    CP_EXCHANGES,
    EP_DISPATCHERS,
    LOSS_CAST_BYTES,
    OFFLOAD_MODES,
    TP_OVERLAP_METHODS,
)
from autoplan.errors import ConfigError

if TYPE_CHECKING:
    from autoplan.cost.runtime_traits import RuntimeTraits


def _refuse(field: str, value: Any, fix: str) -> None:
    """Raise the one-line error for a runtime field's value."""
    raise ConfigError(f"runtime.{field}", f"got {value!r}", fix)


def _check_list(field: str, values: Any, allowed: Any, fix: str, nonempty: bool = False,
                required: str | None = None, whole: bool = False) -> None:
    """Refuse a list field with a member outside `allowed`, without `required`, empty where
    `nonempty`, or (`whole`) with a boolean where whole numbers belong."""
    members = list(values)
    if (any(v not in allowed or (whole and isinstance(v, bool)) for v in members)
            or (nonempty and not members) or (required is not None and required not in members)):
        _refuse(field, members, fix)


def check_traits(traits: RuntimeTraits) -> None:
    """Refuse a blank name, or any field value out of its range, kinds or lists."""
    # every estimate prints the name ("priced for runtime <name>"): a blank one reads as none
    if not isinstance(traits.name, str) or not traits.name.strip():
        _refuse("name", traits.name, "give the runtime a name, or leave name out of a file "
                                     "with a base to be called <base>+<file stem>")
    _check_numbers(traits)
    _check_choices(traits)
    _check_lists(traits)


def _check_numbers(traits: RuntimeTraits) -> None:
    """Byte counts, fractions, factors and SM counts in their ranges."""
    if not 0.0 <= traits.optimizer_extra_bytes <= 64.0:
        _refuse("optimizer_extra_bytes", traits.optimizer_extra_bytes,
                "expected 0 to 64 bytes per sharded parameter")
    if not 0.0 <= traits.grad_accumulate_bytes <= 32.0:
        _refuse("grad_accumulate_bytes", traits.grad_accumulate_bytes,
                "expected 0 to 32 bytes per parameter")
    if not 0.0 <= traits.fp8_weight_cache_bytes <= 4.0:
        _refuse("fp8_weight_cache_bytes", traits.fp8_weight_cache_bytes,
                "expected 0 to 4 bytes")
    for f in ("grad_bytes_bf16", "grad_bytes_fp16", "reduce_bytes_bf16", "reduce_bytes_fp16",
              "logit_bytes_saved", "logit_bytes_transient"):
        if not 0 < getattr(traits, f) <= 8:
            _refuse(f, getattr(traits, f), "expected bytes in (0, 8]")
    floor = LOSS_CAST_BYTES if traits.loss_casts else 0.0
    if not floor < traits.loss_bytes_per_logit <= 256.0:
        _refuse("loss_bytes_per_logit", traits.loss_bytes_per_logit,
                f"expected bytes in ({floor:g}, 256]"
                + (" (the casts alone move that much; loss_casts: false for a kernel "
                   "without them)" if traits.loss_casts else ""))
    passes = traits.train_metric_passes
    if isinstance(passes, bool) or not isinstance(passes, int) or not 0 <= passes <= 8:
        _refuse("train_metric_passes", passes,
                "expected a whole number of passes over the logits from 0 to 8 (2: Composer's "
                "LanguageCrossEntropy and LanguagePerplexity)")
    fp8_gemm = traits.fp8_gemm_efficiency
    if isinstance(fp8_gemm, bool) or not isinstance(fp8_gemm, (int, float)) or not (
            0.1 <= fp8_gemm <= 1.5):
        _refuse("fp8_gemm_efficiency", fp8_gemm,
                "expected a factor from 0.1 to 1.5 on the profile's fp8 GEMM speed")
    for f in ("tp_comm_overlap", "ep_comm_overlap"):
        if not 0.0 <= getattr(traits, f) <= 1.0:
            _refuse(f, getattr(traits, f), "expected a fraction from 0 to 1")
    if traits.ep_dispatch_bytes is not None and not 0 < traits.ep_dispatch_bytes <= 4:
        _refuse("ep_dispatch_bytes", traits.ep_dispatch_bytes,
                "expected bytes in (0, 4], or null")
    for f in ("comm_reserved_sms", "userbuffers_proj_sms", "userbuffers_fc2_sms"):
        value = getattr(traits, f)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
            _refuse(f, value, "expected a whole number of SMs from 0 to 1024")


def _check_choices(traits: RuntimeTraits) -> None:
    """Fields that name one of a few kinds."""
    if not isinstance(traits.dualpipe, bool):
        _refuse("dualpipe", traits.dualpipe, "expected true or false")
    for field, allowed in (("ep_dispatcher", EP_DISPATCHERS),
                           ("cp_exchange", CP_EXCHANGES),
                           ("tp_comm_overlap_method", TP_OVERLAP_METHODS),
                           ("attention_kernel", ATTENTION_KERNELS)):
        if getattr(traits, field) not in allowed:
            _refuse(field, getattr(traits, field),
                    "choose " + (" or " if len(allowed) == 2 else ", ").join(allowed))
    if traits.attention_compute_dtype not in (None, "fp32"):
        _refuse("attention_compute_dtype", traits.attention_compute_dtype,
                "choose fp32, or null for the plan's precision")
    if traits.ep_dispatcher == "allgather":
        # Megatron's validate_args: --overlap-moe-expert-parallel-comm needs the alltoall or
        # flex dispatcher; the allgather dispatcher gathers 16-bit activations, unquantized
        if traits.ep_comm_overlap:
            _refuse("ep_comm_overlap", traits.ep_comm_overlap, "the allgather dispatcher "
                    "overlaps nothing (Megatron: alltoall or flex only): set 0")
        if traits.ep_dispatch_bytes is not None:
            _refuse("ep_dispatch_bytes", traits.ep_dispatch_bytes, "the allgather "
                    "dispatcher sends the activations as they are: leave it null")


def _check_lists(traits: RuntimeTraits) -> None:
    """Lists of what the runtime has: each member known, and the required ones there."""
    known = ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble")
    _check_list("schedules", traits.schedules, known, f"list some of {', '.join(known)}",
                nonempty=True)
    _check_list("multi_stage_schedules", traits.multi_stage_schedules, traits.schedules,
                f"list some of runtime.schedules ({', '.join(traits.schedules)})")
    _check_list("offload", traits.offload, OFFLOAD_MODES,
                "list some of optimizer, params, both (or [] for none)")
    _check_list("offload_zero_stages", traits.offload_zero_stages, (1, 2, 3),
                "list some of the ZeRO stages 1, 2, 3 (an optimizer offload needs a "
                "sharded optimizer)", nonempty=True, whole=True)
    splits = ("even", "balanced", "ends", "embed-loss", "deepspeed")
    _check_list("layer_splits", traits.layer_splits, splits,
                f"list even and any of {', '.join(splits[1:])}", required="even")
    modules = ("core_attn", "mlp", "layernorm", "moe_act", "moe")
    _check_list("recompute_modules", traits.recompute_modules, modules,
                f"list some of {', '.join(modules)} (or [] for none)")
    _check_list("grad_reduce_dtypes", traits.grad_reduce_dtypes, ("fp32", "bf16"),
                "list some of fp32, bf16 (or [] for the runtime's own default only)")
    _check_list("hsdp_zero_stages", traits.hsdp_zero_stages, (1, 2, 3),
                "list some of 1, 2, 3 (or none)")
    _check_list("parallel_dims", traits.parallel_dims, ("tp", "pp", "cp", "ep"),
                "list some of tp, pp, cp, ep (or [] for data parallel only)")
    _check_list("precisions", traits.precisions, ("bf16", "fp16", "fp32", "fp8"),
                "list some of bf16, fp16, fp32, fp8", nonempty=True)
    _check_list("model_code", traits.model_code, ("moe", "mla", "mtp"),
                "list some of moe, mla, mtp (or [] for dense models only)")
    _check_list("recompute_policies", traits.recompute_policies, ("none", "selective", "full"),
                "list none and any of selective, full", required="none")
    _check_list("zero_stages", traits.zero_stages, (0, 1, 2, 3), "list some of 0, 1, 2, 3",
                nonempty=True)
