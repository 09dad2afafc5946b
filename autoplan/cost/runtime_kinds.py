"""The vocabulary of runtime traits: what `recompute: selective` means, when ZeRO gradients are
reduced under a pipeline, and the values RuntimeTraits' choice fields take (runtime_traits.py).
"""

from __future__ import annotations

import enum


class SelectiveKind(str, enum.Enum):
    """What `recompute: selective` means in a runtime."""

    ATTENTION_CORE = "attention-core"
    """Megatron-LM/Core `--recompute-granularity selective` (recompute_modules: core_attn):
    re-runs the attention core (QK^T, softmax, dropout, attention x V) and keeps everything
    else (Korthikanti et al. 2022 §5). Under a fused (flash) kernel the core keeps only its row
    statistics, so this saves almost nothing and costs one more attention forward."""
    ALL_BUT_GEMMS = "all-but-gemms"
    """autoplan's runtime (runtime/recompute.py): a checkpoint policy that must-saves GEMM and
    fused-attention outputs and re-runs everything else (norms, activation functions, dropout,
    residual adds): the 20sbh of GPT's 34sbh that GEMMs and SDPA produce are kept."""
    DEEPSEEK_V3 = "deepseek-v3"
    """DeepSeek-V3's recompute (report §3.2.3 and §3.3.3, "Low-Precision Activation" (2)): all
    RMSNorms and the MLA up-projections re-run in backward, so the norms' outputs (the next
    GEMMs' saved inputs, the routed tokens' own dispatched copies aside) and the up-projected
    Q, K, V are not kept, the MLA latents are (activations.py `mla_latent`); SwiGLU keeps its input
    (in FP8 in an fp8 run) and re-runs its output. Re-run: the norms' and SwiGLU's element-wise
    work and the two up-projection GEMMs (q_up, kv_up)."""
    OP_SAC = "op-sac"
    """torchtitan's op-level selective activation checkpointing (activation_checkpoint.mode
    = "selective", selective_ac_option = "op"): saves the outputs of SDPA and of every second
    matmul and re-runs the rest (torchtitan/models/llama3/infra/parallelize.py, _save_list)."""


class PipelineGradSync(str, enum.Enum):
    """When a runtime reduces ZeRO-2/3 gradients under a pipeline schedule."""

    LAST_MICROBATCH = "last-microbatch"
    """torch.distributed.pipelining disables FSDP gradient sync and resharding until the last
    micro-batch's backward (PipelineStage.backward_maybe_with_nosync): full gradients are
    accumulated and reduce-scattered once per step."""
    EVERY_MICROBATCH = "every-microbatch"
    """Gradients are reduce-scattered after every micro-batch and stay sharded."""


LOSS_CAST_BYTES = 12.0
"""Bytes per logit of the loss's upcast of 16-bit logits (read 2, write 4) and of the cast of
their gradient back (read 4, write 2)."""
METRIC_PASS_BYTES = 14.0
"""HBM bytes per 16-bit logit of one torch cross-entropy forward that a trainer runs on the
logits for a metric (RuntimeTraits.train_metric_passes), counted op by op: under autocast
cross_entropy runs in fp32 (PyTorch's AMP op reference lists cross_entropy among the "CUDA ops
that can autocast to float32"), so the logits are upcast (read 2, write 4) and log_softmax
reads and writes fp32 (8); nll_loss gathers one logit per token. An fp32 run has no upcast:
LOSS_CAST_BYTES / 2 fewer."""
METRIC_PASS_LIVE_BYTES = 10.0
"""Bytes per 16-bit logit alive while a metric pass runs: the logits the trainer keeps as the
step's outputs (2), their fp32 upcast (4) and log_softmax's fp32 output (4); passes run one
after another. fp32 logits: 4 + 4 (no upcast)."""

OFFLOAD_MODES = {"optimizer": "the optimizer alone", "params": "the parameters alone",
                 "both": "parameters and optimizer together"}
"""RuntimeTraits.offload values, as messages name them."""

TP_OVERLAP_METHODS = ("none", "async-dgrad", "userbuffers")
"""RuntimeTraits.tp_comm_overlap_method values."""
EP_DISPATCHERS = ("alltoall", "deepep", "allgather")
"""RuntimeTraits.ep_dispatcher's kinds."""
CP_EXCHANGES = ("all-gather", "torch-ring", "te-p2p")
"""RuntimeTraits.cp_exchange values."""
ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "fa-triton", "sdpa-cpu")
"""RuntimeTraits.attention_kernel values."""
