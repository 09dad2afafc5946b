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
CP_EXCHANGE = "p2p"
"""--cp-comm-type: Transformer Engine's P2P ring (AttnFuncWithCPAndKVP2P), Megatron's default,
as the megatron runtime prices context parallelism (cp_exchange te-p2p: cost/te_ring.py); written
out so the run does not depend on the default. Megatron-Core's and TE's spelling
(TransformerConfig.cp_comm_type: "p2p", "all_gather", "a2a", "a2a+p2p")."""
FP8_FORMAT = "hybrid"
"""--fp8-format: E4M3 forward, E5M2 gradients, as Precision.FP8 is defined."""


def te_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What of the plan's precision, attention and experts Transformer Engine and Megatron-Core
    cannot run: the megatron runtime's own rules (cost/kernel_rules.engine_reasons, and its
    device rules on the plan's GPU where its profile loads here: no fused attention before
    Ampere), so a search priced for megatron and this export refuse the same plans."""
    from autoplan.cost.kernel_rules import device_refusals, engine_reasons
    from autoplan.cost.runtimes import load_runtime
    from autoplan.errors import ConfigError
    from autoplan.hardware import load_profile

    try:
        device = load_profile(plan.cluster.profile).device
    except ConfigError:  # priced elsewhere; the rules that need no device still hold
        return engine_reasons(plan, model)
    return engine_reasons(plan, model) + device_refusals(plan, load_runtime("megatron"), model,
                                                         device)


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
