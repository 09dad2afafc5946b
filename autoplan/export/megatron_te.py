"""Megatron-LM flags Transformer Engine runs for `export --to megatron`: the precision (bf16, fp16,
fp8 GEMMs in a bf16 run), the attention backend and context parallelism's K/V exchange, and the
plans Transformer Engine cannot run so. Flag spellings: megatron/training/arguments.py at
NVIDIA/Megatron-LM 000c4ac24f; backend rules: transformer_engine/pytorch/attention/
dot_product_attention/utils.py get_attention_backend and context_parallel.py.
"""

from __future__ import annotations

from autoplan.model_spec import ModelSpec
from autoplan.plan import Attention, Plan, Precision

ATTENTION_BACKENDS = {Attention.FLASH: "fused", Attention.EAGER: "unfused"}
"""Plan attention -> Megatron --attention-backend. flash: TE's cuDNN fused attention, the kernel
the megatron runtime prices (attention_kernel cudnn); `flash` would switch cuDNN off for the
flash-attn package (megatron/core/models/common/language_module/language_module.py
_set_attention_backend sets NVTE_FUSED_ATTN=0). unfused keeps the s x s scores."""
CP_EXCHANGE = "all_gather"
"""--cp-comm-type: one K/V all-gather per layer, as the megatron runtime prices context
parallelism (cp_exchange all-gather; Megatron's default is the p2p ring). Megatron-Core's and
TE's spelling (TransformerConfig.cp_comm_type: "p2p", "all_gather", "a2a", "a2a+p2p")."""
FP8_FORMAT = "hybrid"
"""--fp8-format: E4M3 forward, E5M2 gradients, as Precision.FP8 is defined."""


def te_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What of the plan's precision and attention Transformer Engine cannot run."""
    why, cp = [], plan.parallel.cp
    if plan.precision == Precision.FP32 and plan.attention == Attention.FLASH:
        # get_attention_backend: FusedAttention needs qkv_dtype bf16/fp16 (fp8); the flag
        # switches the other backends off
        why.append("precision fp32 with attention flash: Transformer Engine's fused (cuDNN) "
                   "attention, which --attention-backend fused selects alone, takes bf16 or "
                   "fp16 inputs only; use bf16, or attention eager")
    if plan.attention == Attention.EAGER and cp > 1:
        # get_attention_backend: "Disabling UnfusedDotProductAttention as it does not support
        # context parallelism"
        why.append(f"attention eager with cp={cp}: Transformer Engine's unfused attention has "
                   "no context parallelism; use attention flash or cp=1")
    if model.mla is not None and cp > 1:
        # context_parallel.py attn_forward_func_with_cp: MLA only with cp_comm_type p2p/a2a+p2p
        why.append(f"model.mla with cp={cp}: Transformer Engine runs latent attention's context "
                   "parallelism only as the p2p ring, not the K/V all-gather the megatron "
                   "runtime prices; use cp=1")
    return why


def te_args(plan: Plan) -> list[str]:
    """Precision, attention backend and CP exchange flags of a plan `te_reasons` accepted."""
    a: list[str] = []
    if plan.precision in (Precision.BF16, Precision.FP8):  # no flag: Megatron trains in fp32
        a.append("--bf16")
    elif plan.precision == Precision.FP16:
        a.append("--fp16")
    if plan.precision == Precision.FP8:  # TE's fp8 GEMMs inside the bf16 run (default recipe:
        # delayed scaling); --fp8-format's dest is args.fp8 (_add_transformer_engine_args)
        a.append(f"--fp8-format {FP8_FORMAT}")
    if plan.grad_reduce_dtype is not None:  # null: Megatron's default (fp32 for bf16 runs)
        a.append("--grad-reduce-in-bf16" if plan.grad_reduce_dtype.value == "bf16"
                 else "--accumulate-allreduce-grads-in-fp32")
    a.append(f"--attention-backend {ATTENTION_BACKENDS[plan.attention]}")
    if plan.parallel.cp > 1:  # nargs='+': one type for every layer
        a.append(f"--cp-comm-type {CP_EXCHANGE}")
    return a
