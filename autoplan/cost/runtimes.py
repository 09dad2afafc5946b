"""Runtime traits: what the software that runs a plan does, apart from the hardware it runs on.

The same plan costs different memory and time under Megatron-Core and under autoplan's runtime:
which kernels are fused, what selective recompute keeps, which dtype gradients are reduced in,
which communication overlaps and which schedules exist. A `RuntimeTraits` says that; presets
below, or a YAML file of the same fields (loaded strictly). Host costs per op stay in the
hardware profile (they are measured on one machine by `autoplan profile`); a runtime says
whether it pays them (`eager_host_overheads`) and whether its host runs ahead of the device
(`host_runs_ahead`: then they cost only what the kernels do not cover).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.cost.runtime_presets import RUNTIME_PRESETS, RUNTIMES
from autoplan.errors import ConfigError
from autoplan.yaml_io import check_schema_version, from_dict, read_yaml, show


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
    Q, K, V are not kept, the MLA latents are (memory.py `mla_latent`); SwiGLU keeps its input
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

OFFLOAD_MODES = {"optimizer": "the optimizer alone", "params": "the parameters alone",
                 "both": "parameters and optimizer together"}
"""RuntimeTraits.offload values, as messages name them."""



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

@dataclass(frozen=True)
class RuntimeTraits:
    """The software side of the cost model (DESIGN.md section 6: hardware x runtime x plan)."""

    name: str
    """Identifier shown with every estimate ("priced for megatron"). A traits file that starts
    from a preset and names itself nothing is `<base>+<file stem>`, so it never reads as the
    untouched preset."""
    base: str | None = None
    """The preset a traits file or mapping started from (its `base:`), whose validated runs
    give the estimate's error band (error_band.family) whatever the file calls itself. None: a
    preset, or traits of their own."""
    description: str = ""
    fused_norm: bool = True
    """Norms keep their 16-bit input and fp32 row statistics (fused LayerNorm/RMSNorm kernels:
    Apex/TE, torch's CUDA `_fused_rms_norm`). False: torch's composite RMSNorm off CUDA keeps
    its fp32 upcast input and fp32 normalised input per norm (measured by
    autoplan.profiler.activations on CPU)."""
    fused_swiglu: bool = True
    """SwiGLU keeps its gate+up GEMM output and the product (6 bytes per ffn element per token in
    16-bit; Megatron's bias_swiglu fusion). False: eager silu(gate) * up also keeps silu's
    output (8)."""
    selective: SelectiveKind = SelectiveKind.ATTENTION_CORE
    """What selective recompute keeps and re-runs."""
    optimizer_extra_bytes: float = 4.0
    """HBM bytes per sharded parameter the optimizer step moves beside the fused Adam kernel
    (step_time.ADAM_BYTES_PER_PARAM): FSDP2 (autoplan, torchtitan) reads the fp32 gradients
    for the gradient norm (4; clip_grad_norm_) and sets them to None. Megatron-Core's
    distributed optimizer reads them for the norm (4) and copies the updated fp32 shard into
    the 16-bit parameter buffer (read 4, write 2): 10, plus its full gradient buffer zeroed
    (`zeroes_grad_buffer`). DeepSpeed ZeRO-1/2 reads the 16-bit partition for the norm (2),
    casts it to the fp32 master gradient (read 2, write 4) and copies the master back into
    the 16-bit weights (read 4, write 2): 14."""
    adds_into_grad_buffer: bool = False
    """Backward's 16-bit gradient of a tensor whose weight-gradient kernel does not accumulate in
    place is added into the runtime's own gradient buffer afterwards (Megatron-Core DDP's hook:
    `param.main_grad.add_(param.grad.data)`; gradient_accumulation_fusion covers the Linear
    layers only), so the embedding's dense gradient is read once more and the buffer read and
    written each micro-batch (stage_time.embedding_grad_s). False: the gradient goes straight to
    its reduction (FSDP2, whose copy-in fsdp2_copies prices) or accumulates in place."""
    zeroes_grad_buffer: bool = False
    """Each step zeroes the rank's gradient buffer, grad_bytes per parameter it holds: all of
    them under DDP and the distributed optimizer (ZeRO 0-1), its shard under FSDP (ZeRO-2/3)
    (Megatron-Core DistributedDataParallel.zero_grad_buffer -> buffer.reset())."""
    pipeline_scatter_gather: bool = False
    """Without sequence parallelism a pipeline stage sends each tensor-parallel rank's 1/tp slice
    of the (replicated) activation or gradient to its peer in the next stage, which all-gathers
    the slices inside its node: Narayanan et al. 2021 §4.1, the scatter/gather optimisation
    (Megatron-LM's --no-scatter-gather-tensors-in-pipeline turns it off; on by default, and
    p2p_communication._communicate splits with split_tensor_into_1d_equal_chunks); DeepSpeed's
    PipelineEngine alike (is_pipe_partitioned / is_grad_partitioned = is_model_parallel, sent as
    PartitionedTensor). False: every tensor-parallel rank sends the whole tensor (Megatron-Core's
    p2p_communication, torch.distributed.pipelining)."""
    reentrant_recompute: bool = False
    """Full recompute re-runs the block's whole forward inside backward, every forward
    tensor-parallel collective with it (2 all-reduces, or 2 all-gathers + 2 reduce-scatters):
    a reentrant checkpoint, Megatron-Core's tensor_parallel.random.CheckpointFunction
    (backward: `outputs = ctx.run_function(*detached_inputs)`; TE's te_checkpoint alike) and
    DeepSpeed's activation_checkpointing.checkpointing.CheckpointFunction. Korthikanti et al.
    2022 Table 4 measures the 22B layer's full-recompute overhead at 7.6 ms against a 7.7 ms
    forward. False: torch's non-reentrant checkpoint (autoplan's runtime, torchtitan) stops at
    the last tensor backward needs and does not redo the block's final collective."""
    recompute_early_stop: bool = True
    """Where the checkpoint is not reentrant, full recompute stops as soon as the last tensor
    the block's forward saved is made again (torch.utils.checkpoint.set_checkpoint_early_stop,
    on by default from torch 2.1): autograd saves a GEMM's input before the GEMM runs, so the
    block's last GEMM (the MLP's down projection) is not re-run. Measured: torch's non-reentrant
    checkpoint of a GPT block re-runs 3 of its 4 forward GEMMs (tests/unit/cost/
    test_runtimes.py). False: a torch before 2.1 (llm-foundry's MPT runs: 1.13 and 2.0.1), which
    recomputes the whole block. Dense blocks only: an MoE block's experts feed its weighted
    combine, whose saved tensors come after them."""
    grad_bytes_bf16: float = 4.0
    """Bytes per gradient element in a bf16 run: Megatron accumulates into an fp32 main_grad
    buffer (Megatron-LM's arguments.py forces accumulate_allreduce_grads_in_fp32 on for bf16;
    NeMo 2's and Megatron-Bridge's bf16_mixed() set grad_reduce_in_fp32=True, which their
    mixed-precision setup copies onto the DDP config); FSDP2 with reduce_dtype=fp32 keeps fp32
    sharded gradients. A plan that reduces in bf16 (Plan.grad_reduce_dtype, as NVIDIA's
    performance recipes do) keeps 2 where grads_in_reduce_dtype."""
    grad_bytes_fp16: float = 2.0
    """Bytes per gradient element in an fp16 run: Megatron keeps fp16 gradients unless
    --accumulate-allreduce-grads-in-fp32 (the SC21 runs: 16 bytes per parameter in all)."""
    reduce_bytes_bf16: float = 4.0
    """Bytes per gradient element on the wire in data-parallel reductions of a bf16 run."""
    reduce_bytes_fp16: float = 2.0
    """The same for an fp16 run."""
    grads_in_reduce_dtype: bool = False
    """The gradient buffer is kept in the dtype the plan reduces in (Plan.grad_reduce_dtype):
    Megatron-Core's DDP allocates its grad buffer in fp32 when grad_reduce_in_fp32, else in the
    parameter dtype (distributed/distributed_data_parallel.py, param_and_grad_buffer.py), and
    Apex DistributedFusedAdam (NeMo 1) its buffer in grad_sync_dtype. False: the buffer keeps
    grad_bytes_* whatever the wire dtype (FSDP2: sharded gradients in the sharded parameters'
    dtype; DeepSpeed: communication_data_type changes the wire only)."""
    fp32_sharded_params: bool = False
    """FSDP2 mixed precision: the sharded parameters are the fp32 master weights (4 bytes,
    sharded like the optimizer) and the optimizer holds only Adam m and v (8); compute copies
    are 16-bit and gathered per unit. False: a separate 16-bit model (2) and fp32 master + m + v
    in the optimizer (12; Megatron, DeepSpeed)."""
    fsdp2_copies: bool = False
    """ZeRO-1/2/3 runs on FSDP2, whose copies around its collectives run on the compute stream
    (torch/distributed/fsdp/_fully_shard): each all-gather's copy-out into the unsharded
    16-bit parameters in the next unit's pre-forward (FSDPParamGroup.wait_for_unshard:
    foreach_all_gather_copy_out, read and write 2 bytes per parameter), and each
    reduce-scatter's copy-in of the unsharded gradients into its input in the reduce dtype
    before the reduce-scatter stream waits (foreach_reduce: foreach_reduce_scatter_copy_in,
    read 2, write the reduce dtype's bytes). Nothing hides them. False: the runtime gathers into
    and reduces from contiguous buffers (Megatron's distributed optimizer, DeepSpeed)."""
    pipeline_grad_sync: PipelineGradSync = PipelineGradSync.LAST_MICROBATCH
    """When ZeRO-2/3 gradients are reduce-scattered under a pipeline."""
    overlap_dp_comm: bool = True
    """Data-parallel reductions overlap backward (DDP buckets, FSDP2 reduce-scatter streams,
    Megatron --overlap-grad-reduce); the profile's `efficiency.overlap` says how well."""
    pipeline_engine_reduce: bool = False
    """Under a pipeline (pp > 1) the data-parallel gradient reduction runs as its own step of
    the schedule after the last backward, overlapping nothing, and a bf16 plan's gradients are
    kept and reduced in fp32 (DeepSpeed's PipelineEngine: TrainSchedule issues ReduceGrads
    after the last BackwardPass; with bf16, BF16_Optimizer accumulates each 16-bit gradient
    into its fp32 gradient buffers and `_exec_reduce_grads` -> `_bf16_reduce_grads`
    all-reduces "the optimizer's FP32 grads": deepspeed/runtime/pipe/schedule.py and
    engine.py; BLOOM's tr11 script runs ZeRO stage 0, "bf16 must use z0! it implements its
    own zero stage 1 equivalent"). The engine keeps the 16-bit gradients beside that buffer
    between backward passes and the optimizer adds them in once per micro-batch
    (rows.BF16_OPTIMIZER_GRAD_BYTES, BF16_OPTIMIZER_ACCUMULATE_BYTES). A plan's explicit
    grad_reduce_dtype is priced as asked."""
    overlap_param_gather: bool = True
    """ZeRO parameter all-gathers overlap the neighbouring compute (FSDP2 prefetch, Megatron
    --overlap-param-gather): only the first gather and the last reduce-scatter of a step are
    exposed, and the rest as far as the compute beside them hides it."""
    chunked_dp_sync: bool = False
    """Under an interleaved pipeline (vpp > 1) each model chunk's once-per-step data-parallel
    traffic is launched on its own, beside the other chunks' work: a chunk's gradient
    reduction as soon as its last micro-batch's backward ends, behind the backward of the
    chunks that follow (j x pp chunk-backwards for chunk j of the final group, counting the
    drain idle of later ranks, whose launch is offset by their rank), and the next chunk's
    parameter gather at a chunk's first forward, pp chunk-forwards before it is needed
    (Megatron-Core's interleaved schedule: megatron/core/pipeline_parallel/schedules.py
    forward_backward_pipelining_with_interleaving, grad_sync_func at
    is_last_microbatch_for_model_chunk(virtual_microbatch_id - pipeline_parallel_rank),
    param_sync_func for the next chunk at is_first_microbatch_for_model_chunk; chunks 0 and 1
    gathered before the warm-up). Only chunk 0's share waits on its own last backward and
    first forward. False: the step's reduction hides behind the last micro-batch's backward
    and its gather behind the first forward, whole (torch.distributed.pipelining with FSDP2,
    whose final backward callback waits for each stage's reduce-scatter)."""
    tp_comm_overlap: float = 0.0
    """Fraction of tensor-parallel collective time hidden behind GEMMs, for a runtime whose
    method is not modelled below. 0: none."""
    tp_comm_overlap_method: str = "none"
    """none; `async-dgrad`: the column-parallel GEMMs' backward launches its input-gradient
    all-reduce (reduce-scatter with SP) asynchronously and computes the weight gradient while it
    runs (Transformer Engine's Linear / LayerNormLinear backward: `allreduce(dgrad, tp_group,
    async_op=True)` or `reduce_scatter_along_first_dim(..., async_op=True)` before "Compute grad
    weight tensor"; Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication alike),
    Megatron-Core's default without --tp-comm-overlap; or `userbuffers`: Transformer Engine's
    comm-GEMM overlap (Megatron --tp-comm-overlap; NeMo's large-model recipes turn it on). Each
    is priced from what its collectives expose (`tp_exposed_share`); userbuffers needs sequence
    parallelism and tp >= 2."""
    ep_comm_overlap: float = 0.0
    """Fraction of the MoE all-to-all time hidden behind another micro-batch's compute, up to
    that compute (Megatron --overlap-moe-expert-parallel-comm, batch-level overlap in 1F1B;
    DeepSeek-V3's DualPipe, report §3.2.1). 0: the dispatch and combine are exposed."""
    ep_dispatch_bytes: float | None = None
    """Bytes per element of the two dispatch-direction all-to-alls (forward dispatch, backward
    of the combine); None: the activations' width. DeepSeek-V3 §3.3.2 quantizes them to FP8
    (1) and keeps the combines in BF16."""
    ep_dispatcher: str = "alltoall"
    """How tokens reach their experts. `alltoall`: one copy per routed expert over the EP group
    (Megatron-Core --moe-token-dispatcher-type alltoall). `deepep`: one copy per destination
    node, forwarded to its experts over NVLink (DeepEP's internode kernels; Megatron-Core
    --moe-token-dispatcher-type flex with the DeepEP backend; DeepSeek-V3 report §3.2.2), so a
    group across nodes sends moe.node_dedup_share of the copies through the NICs. `allgather`:
    every token to every rank of the expert-TP x EP group, each keeping those for its experts,
    and the outputs reduce-scattered back (Megatron-Core --moe-token-dispatcher-type allgather,
    its default; moe.all_gather_dispatch_s), through a gather buffer it keeps
    (moe.all_gather_buffer_bytes)."""
    cp_exchange: str = "all-gather"
    """How context parallelism brings each rank the K/V of the whole sequence. `all-gather`: one
    all-gather of the grouped K/V heads before attention and a reduce-scatter of their gradients
    after it, both exposed (autoplan's runtime, runtime/context_parallel.py; Llama 3's stack,
    Dubey et al. 2024 §3.3.2: "the all-gather communication latency is exposed in the critical
    path"). `torch-ring`: PyTorch's ring attention (context_parallel, as torchtitan runs it):
    K/V as SDPA sees them (repeated where `kv_repeated`) all-gathered behind the first ring
    step, fp32 dK/dV passed around the ring behind each backward step, and the fp32 merges of
    the per-step outputs and gradients (comm.torch_ring_time_s,
    compute.torch_ring_elementwise_bytes)."""
    own_runtime_rules: bool = False
    """The runtime is autoplan's own (`autoplan train`): the limits only it has
    (autoplan.plan_rules.RUNTIME_RULES: layernorm recompute under tp, a MoE capacity factor
    with cp, HSDP with experts, ...) bind it too, so a search priced for it keeps to plans it
    trains and `estimate` names what it would refuse."""
    comm_reserved_sms: int = 0
    """SMs the runtime keeps for its communication kernels for the whole step, so GEMMs and
    attention run on the rest: compute is priced at (sm_count - this) / sm_count of the
    profile's throughput, with waves counted on the SMs left (the profile needs sm_count).
    DeepSeek-V3 dedicates 20 of the H800's 132 SMs to its overlapped all-to-all (report
    §3.2.2). 0: NCCL's kernels share SMs only while a collective runs (the profile's
    efficiency.comm_slowdown prices that, comm.contention_s)."""
    userbuffers_proj_sms: int = 0
    """SMs Transformer Engine's pipelined userbuffers overlap keeps for its reduce-scatter while
    the attention output projection's forward GEMM runs (`proj_fprop` with set_sm_margin: the
    GEMM runs on the other SMs; priced where userbuffers applies). NeMo's H100 70B and 405B
    recipes: 24 (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py,
    userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192 and ..._h16384_tp8_cp2_...)."""
    userbuffers_fc2_sms: int = 0
    """The same for the dense MLP's second GEMM forward (`fc2_fprop`): 16 in NeMo's H100 70B
    recipe, 8 in its 405B one (same file). The ring-exchange overlaps (qkv/fc1 fprop,
    proj/fc2 dgrad) copy on the copy engines and hold no SMs; the bulk ones (the QKV and fc1
    backward) hold theirs only while they run (comm.contention_s)."""
    dualpipe: bool = False
    """The runtime runs a pipelined plan as DeepSeek's DualPipe (DeepSeek-V3 report §3.2.1,
    Figure 5, Table 2; github.com/deepseek-ai/DualPipe): micro-batches enter from both ends, so
    rank i holds stages i and pp-1-i (Table 2: 2x the parameters) and spends per micro-batch
    the mean of its two stages' times; bubble and in-flight counts: pipeline.dualpipe_*
    (ep_comm_overlap hides its all-to-alls). Needs an even pp, vpp 1 and an even micro-batch
    count of at least 2 pp (runtime_rules). No preset has it: a pricing of that external
    runtime (benchmarks/deepseek_v3_runtime.yaml)."""
    attention_kernel: str = "fa2"
    """The fused attention kernel (fa2, fa3, cudnn): its speed per GPU is the profile's
    (efficiency.attention_forward/backward). PyTorch's SDPA runs FlashAttention-2 on A100 and
    H100; Transformer Engine picks cuDNN's fused attention on Hopper. fa-triton: FlashAttention's
    Triton implementation (MosaicML llm-foundry's attn_impl: triton of 2023), priced from the
    FlashAttention-2 figures (compute.TRITON_FA_SLOWDOWN). sdpa-cpu: torch's CPU
    flash kernel, whose speed a CPU profile files per dtype (profiler/precision.py)."""
    attention_compute_dtype: str | None = None
    """The dtype the fused attention core computes in for a 16-bit plan. None: the plan's own.
    fp32: autoplan's CPU runtime casts Q, K, V to fp32 for SDPA and the output back
    (runtime/models/layers.py Attention.core), because torch's CPU flash-attention backward in
    bf16 runs 9-45x slower than in fp32 at the tiny block's call while the casts cost ~0.2x of
    the fp32 core (measured by profiler/precision.py); priced at the profile's
    `attention_kernel@fp32` figures and fp32 peak, plus the casts' bytes
    (attention_precision, compute.attention_cast_bytes)."""
    attention_dropout: bool = True
    """Dropout on the attention probabilities at the model's rate (model.dropout), as
    Megatron-LM's attention_dropout and Hugging Face's attention_probs_dropout apply it: an eager
    core keeps its 1-byte mask and dropped output beside the softmax (Korthikanti et al. 2022
    §4.1, 3as^2b). False: dropout only on the residual branches (autoplan's runtime,
    runtime/models/transformer.py Block; torchtitan's Llama has none at all)."""
    causal_attention_skip: bool = True
    """Fused causal attention skips fully masked tiles, doing about half of the s^2 work
    (FlashAttention-2, Dao 2023 §3.1; cuDNN/FA3 alike). Eager attention always does all of it."""
    eager_elementwise: bool = False
    """Element-wise work runs as one eager PyTorch kernel per aten op (each reads and writes
    device memory: compute.EAGER_BYTES_PER_TOKEN, counted on autoplan's block); False: fused
    kernels (Transformer Engine, Apex, torch.compile) move each kept activation a few times."""
    eager_host_overheads: bool = False
    """Pays the profile's measured host seconds per aten op, DTensor op, checkpoint, FSDP unit
    and optimizer tensor (autoplan's own runtime, whose block those figures are measured on:
    `autoplan profile`, profiler/dispatch.py). False: the runtime's ops are not autoplan's, and
    the figures do not describe them (Megatron, torchtitan, DeepSpeed)."""
    host_runs_ahead: bool = False
    """Where host costs are paid, the host issues kernels ahead of an asynchronous device (CUDA
    streams), so a block costs the larger of its device and host seconds, not their sum
    (compute.layer_times_s): host costs bind only where the kernels are too small to cover them
    (small models, high tp, small micro-batches; what CUDA graphs exist to remove). A profile
    built from datasheets has no host costs (0 s per op), so this changes nothing until
    `autoplan profile` has measured the GPU's host. False: one CPU does both (autoplan-cpu)."""
    fp8_weight_cache_bytes: float = 2.0
    """Bytes per parameter an fp8 run keeps beside the 16-bit weights: Transformer Engine caches
    each weight's fp8 copy and its transpose across micro-batches (2); torchao's dynamic
    scaling casts on the fly (0)."""
    fp8_gemm_efficiency: float = 1.0
    """Speed of the runtime's FP8 GEMM kernels over what the profile's matmul curve gives at the
    fp8 peak (a factor on every FP8 GEMM's time: FP8 plans only). 1: kernels as fast as the
    curve (Transformer Engine's per-tensor FP8 on cuBLAS, as priced so far). DeepSeek-V3's
    fine-grained FP8 (1x128 activation tiles, 128x128 weight blocks, partial sums promoted to
    CUDA cores every 128 K elements: report §3.3.2) is slower: the ratio of a kernel's
    measured TFLOPS to the curve's, time-weighted over a model's GEMMs, is derived from the
    DeepGEMM README's table (benchmarks/deepgemm_fp8.py). Backward GEMMs (Dgrad, Wgrad) are
    taken at the forward shapes' factor: no source tabulates them."""
    fp8_activations: bool = True
    """An fp8 run saves its GEMM inputs for backward in fp8 (1 byte instead of 2): TE's
    Linear/LayerNormLinear and torchao's Float8Linear both keep the casts."""
    fp8_experts: bool = True
    """An fp8 run runs the routed experts' grouped GEMMs in fp8 too (Transformer Engine's
    GroupedLinear; DeepSeek-V3 §3.3.1). False: they stay 16-bit, with 16-bit saved inputs and
    no casts (autoplan's runtime: runtime/float8.py swaps nn.Linear only, and its experts are
    GroupedLinear, runtime/models/moe.py)."""
    logit_bytes_saved: float = 4.0
    """Bytes per logit the loss keeps for backward, per micro-batch in flight (the fp32
    softmax of Megatron's vocab-parallel cross-entropy; fp32 log-softmax in torch)."""
    logit_bytes_transient: float = 8.0
    """Bytes per logit the loss of the micro-batch at it holds beyond those at its peak, the
    larger of its forward's and its backward's (memory.logits_bytes). torch's F.cross_entropy
    on upcast logits (autoplan's runtime/parallelize.py loss_function, torchtitan's
    cross_entropy_loss): its backward holds nll_loss_backward's dense fp32 gradient and
    log_softmax_backward's fp32 result beside the saved log-softmax (8; 12 in all), its
    forward the 16-bit logits and their fp32 upcast while log_softmax writes its output (6):
    measured from the allocator's events, 4 bytes per logit kept after forward, 10 at the
    forward's peak, 12 at the backward's (tests/unit/cost/test_memory_review.py).
    Megatron's vocab-parallel cross-entropy upcasts and exponentiates in place, so its saved
    fp32 softmax is that copy: the 16-bit logits and their contiguous transpose remain (4;
    megatron/core/tensor_parallel/cross_entropy.py, megatron-core 0.16), and its backward
    works in place on that softmax and casts it back (2)."""
    loss_bytes_per_logit: float = 44.0
    """HBM bytes the loss kernels move per 16-bit logit, forward + backward (the output GEMMs
    apart), counted op by op. 44: torch's F.cross_entropy on upcast logits (autoplan's runtime,
    torchtitan): the fp32 copy 6, log_softmax 8, nll_loss 4; backward nll_loss 8,
    log_softmax's 12, the cast back 6 (autoplan.profiler.traffic's dispatch counter,
    tests/unit/cost/test_compute.py). 52: Megatron's vocab-parallel cross-entropy
    (megatron/core/tensor_parallel/cross_entropy.py, the default path; Megatron-DeepSpeed's
    mpu/cross_entropy.py is the same): .float() 6, max 4, in-place subtract 8, exp 8, sum 4,
    div_ 8; backward mul_ 8 and the cast back 6. Megatron's --cross-entropy-loss-fusion runs
    the same steps jit-fused (fused_cross_entropy.py: about 36) and its Transformer Engine
    implementation fewer still: a traits YAML sets what a run used. An fp32 plan has no casts
    (loss_bytes). 8: flash_attn's fused cross-entropy (losses/cross_entropy.py, the apex
    xentropy kernel; MosaicML's default loss_fn) reads the 16-bit logits twice forward (max,
    then the sum of exponentials) and once backward, and writes their gradient: no casts."""
    loss_casts: bool = True
    """The loss upcasts 16-bit logits to fp32 and casts the gradient back, LOSS_CAST_BYTES of
    loss_bytes_per_logit, which an fp32 plan does not pay (torch's F.cross_entropy, Megatron's).
    False: the kernel reads the logits as they are (flash_attn's fused cross-entropy), so an
    fp32 plan moves twice the bytes."""
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
    """Pipeline schedules the runtime can run (Plan spelling)."""
    multi_stage_schedules: tuple[str, ...] = ()
    """Of those, the ones it runs only with several stages per rank (vpp >= 2): torchtitan's
    zero-bubble schedules are InterleavedZeroBubble and ZBVZeroBubble, both multi-stage."""
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages the runtime can run."""
    grad_reduce_dtypes: tuple[str, ...] = ("fp32", "bf16")
    """Gradient reduce dtypes a plan may ask for (Plan.grad_reduce_dtype; null, the runtime's
    own default, always runs): torchtitan 0.2.2/0.3.0 accept mixed_precision_reduce float32
    only; Megatron has --grad-reduce-in-bf16, DeepSpeed communication_data_type."""
    hsdp_zero_stages: tuple[int, ...] = (1, 2, 3)
    """ZeRO stages the runtime runs HSDP with (Plan.parallel.dp_shard): Megatron's distributed
    optimizer instances (--num-distributed-optimizer-instances) are ZeRO-1; torchtitan's
    replicate x shard degrees FSDP2's ZeRO-2/3; DeepSpeed has none (MiCS was removed)."""
    moe_eager_tensors: bool = False
    """The MoE layer keeps, beyond its dispatched copies and expert MLP tensors, what an eager
    router and combine save (autoplan's runtime, runtime/models/moe.py; moe.eager_moe_bytes):
    the k expert outputs the gates multiply, the router's fp32 logits and top-k index storage,
    its gates and the index tensors, and a 16-bit run's fp32 upcast of the router input.
    False: the runtimes priced from Megatron-Core's fused router and permutation kernels,
    whose own small tensors are left out."""
    kv_repeated: bool = False
    """Grouped-query attention with the K/V heads repeated to all heads before the attention
    kernel, which then keeps the repeated copies for backward (autoplan's runtime:
    repeat_interleave ahead of SDPA, measured in tests/unit/profiler/test_activations.py;
    torchtitan's repeat_kv). Op-level selective checkpointing re-runs the copies instead.
    False: the kernel reads the grouped heads (FlashAttention, cuDNN/Transformer Engine)."""
    sp_gathered_gemm_inputs: bool = False
    """Under sequence parallelism the column-parallel GEMMs (QKV, the MLP's first) keep their
    all-gathered input for the weight gradient, h-wide on every tensor-parallel rank (2sbh
    each), where Megatron keeps the rank's sequence shard and gathers it again in backward:
    nanotron's column_linear of 2024 (tensor_parallel/functional.py, without async
    communication: `differentiable_all_gather(input)` then `F.linear(input, ...)`, which saves
    the gathered input; its later tp_recompute_allgather option keeps the shard). Backward then
    has no re-gather to run."""
    partial_recompute: bool = True
    """Recompute can cover any number of layers of a stage (Plan.recompute.num_layers:
    Megatron's block and uniform methods, autoplan's runtime). False: torchtitan, whose
    selective_ac_option = n checkpoints every n-th block, which prices as num_layers = L / n
    only without a pipeline and with a count that divides the L layers (export/torchtitan.py)."""
    partial_selective: bool = True
    """Where recompute is partial, it may be selective too (autoplan's runtime checkpoints the
    first num_layers blocks under any policy). False: Megatron, whose --recompute-num-layers
    counts layers for full recompute only (megatron/training/arguments.py validate_args: "recompute
    method is not yet supported for selective recomputing granularity");
    export/megatron.py refuses such a plan alike."""
    nth_block_recompute: bool = True
    """Where recompute is not partial, every n-th block may be checkpointed (torchtitan's
    selective_ac_option). False: every block or none (llm-foundry's activation_checkpointing_fn
    of 2023 wraps every block)."""
    has_sequence_parallel: bool = True
    """The runtime shards the norms and the residual stream over tp (Megatron-LM's
    --sequence-parallel, in its 2022 release: Korthikanti et al. 2022). False: a plan with
    sequence_parallel true is not what it runs (Megatron-LM's 2021 code, the SC21 runs')."""
    fused_attention: bool = True
    """The runtime runs a fused attention kernel (FlashAttention, cuDNN's, PyTorch's SDPA) for
    a plan's `attention: flash`. False: it computes attention unfused only (Megatron-LM before
    2023: its --use-flash-attn came after the 2021 and 2022 releases), so such a plan is not
    what it runs."""
    sequence_parallel_with_tp: bool = False
    """Tensor parallelism always comes with sequence parallelism: the norms and the residual
    stream are sharded over tp whenever tp > 1 (torchtitan <= 0.2.2: its Llama 3
    parallelize_module plan puts SequenceParallel on the norms unconditionally), so a plan with
    tp > 1 and sequence_parallel false is not what it runs. False: either (Megatron's
    --sequence-parallel; torchtitan 0.3's enable_sequence_parallel)."""
    mixed_precision_needs_fsdp: bool = False
    """16-bit (and fp8) training comes only through FSDP's mixed-precision policy, so a bf16 or
    fp8 plan needs FSDP: zero_stage >= 2 with dp > 1, or cp > 1 (torchtitan <= 0.2.2,
    distributed/utils.py maybe_enable_amp: with tp or pp and no FSDP "Mixed precision training
    is disabled", with DDP or one device torch.autocast, neither of which is the bf16 priced
    here). False: the runtime casts without FSDP (Megatron, DeepSpeed; torchtitan 0.3.0 wraps
    every model in fully_shard, shard degree 1 included, llama3/parallelize.py)."""
    recompute_modules: tuple[str, ...] = ("core_attn", "mlp", "layernorm", "moe_act", "moe")
    """Submodules the runtime recomputes by name (Plan recompute.modules, Megatron-Core's
    --recompute-modules): Megatron-Core has them all (TransformerConfig.recompute_modules);
    autoplan's runtime runs them (runtime/module_recompute.py); the 2022 Megatron-LM, torchtitan
    (selective is its op- or layer-level AC) and DeepSpeed (Megatron-DeepSpeed's selective is
    the attention core) have none to name."""
    sharded_zero_with_pipeline: bool = True
    """ZeRO-2/3 composes with pipeline parallelism (FSDP2 under torch.distributed.pipelining, as
    torchtitan's 3D runs). Megatron's ZeRO-2/3 is Megatron-FSDP (--use-megatron-fsdp), whose
    user guide documents no pipeline combination: False."""
    fsdp2_offload: bool = False
    """Offload as FSDP2 runs it (autoplan's runtime, torchtitan): parameter offload
    (CPUOffloadPolicy) puts the sharded parameters, their gradients and so the optimizer state
    and step on the host; optimizer-only offload (autoplan/runtime/offload.py,
    HostOffloadOptimizer) moves the optimizer state and fp32 masters but keeps the parameter and
    gradient shards on the device. False: ZeRO-Offload (DeepSpeed; Ren et al. 2021 §4), whose
    optimizer offload also moves the gradient shard (ZeRO-2/3), streamed during backward."""
    layer_splits: tuple[str, ...] = ("even", "balanced", "ends", "embed-loss")
    """Layer-to-stage splits (search_space.Split values) the runtime runs: any per-stage block
    counts, including an embedding-only first and a loss-only last stage, in autoplan's runtime
    (torch.distributed.pipelining stages of deleted modules), Megatron-Core
    (--pipeline-model-parallel-layout) and torchtitan (module_fqns_per_model_part). DeepSpeed:
    even, or the partition its PipelineModule computes (type:transformer), nothing else."""
    parallel_dims: tuple[str, ...] = ("tp", "pp", "cp", "ep")
    """Model-parallel degrees the runtime splits over beside data parallelism and its ZeRO
    sharding. llm-foundry's MPT training of 2023 ran PyTorch FSDP alone."""
    precisions: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8")
    """Precisions the runtime trains in (Plan spelling). DeepSpeed's config has bf16 and fp16
    sections only: its fp8 GEMMs are model code (Transformer Engine layers)."""
    transformer_engine: bool = False
    """The runtime's attention is Transformer Engine's and its experts Megatron-Core's grouped
    GEMM, with their limits (Megatron-LM's validate_args and TE's get_attention_backend): fused
    attention in 16 bits only, context parallelism only through fused attention, latent
    attention's context parallelism only as TE's p2p ring (export writes all_gather), and the
    grouped GEMM in bf16 only."""
    model_code: tuple[str, ...] = ("moe", "mla", "mtp")
    """Model features the runtime has code for: routed experts (`moe`), multi-head latent
    attention (`mla`), multi-token prediction (`mtp`). DeepSpeed's are model code of their own
    (deepspeed.moe.layer.MoE) that a ds_config cannot state, and llm-foundry's MPT has none."""
    ddp_one_dimensional: bool = False
    """ZeRO-0 (DDP replication) runs only as the sole parallelism, and context parallelism always
    shards: torchtitan applies FSDP whenever dp_shard or cp exceeds 1 and otherwise DDP, which
    raises "DDP has not supported > 1D parallelism" when the world is more than its replicas
    (torchtitan/models/llama3/infra/parallelize.py, 0.2.2)."""
    recompute_policies: tuple[str, ...] = ("none", "selective", "full")
    """Recompute policies the runtime runs (Plan spelling). llm-foundry checkpoints whole
    blocks (fsdp_config.activation_checkpointing) or none."""
    selective_needs_model_parallel: bool = False
    """Selective recompute runs only through the model code that tensor or pipeline
    parallelism brings: DeepSpeed's ds_config checkpoints whole blocks
    (activation_checkpointing), while Megatron-DeepSpeed's --recompute-granularity selective
    (the attention core) comes with its TP/PP model (export/deepspeed.py,
    export/megatron_deepspeed.py runs_3d)."""
    offload: tuple[str, ...] = ("optimizer", "params", "both")
    """Host offload the runtime can run, besides none: `optimizer` (states and the step on the
    host), `params` (weights streamed in per layer), `both`. FSDP2's CPUOffloadPolicy moves
    parameters, gradients and optimizer states together and only on fully sharded modules
    (torch.distributed.fsdp.fully_shard docs), so torchtitan has `both` only; Megatron-Core
    offloads the distributed optimizer only (--optimizer-cpu-offload, megatron-core >= 0.9).
    The ZeRO stage each needs is a plan rule (parameters: ZeRO-3; optimizer: ZeRO >= 1)."""
    offload_zero_stages: tuple[int, ...] = (1, 2, 3)
    """ZeRO stages the runtime runs an optimizer offload with. Megatron-Core's
    --optimizer-cpu-offload is its distributed optimizer's (megatron/core/optimizer/__init__.py
    builds HybridDeviceOptimizer, torch's AdamW on the host, inside DistributedOptimizer): ZeRO-1
    only, as `autoplan export --to megatron` refuses any other stage. DeepSpeed offloads the
    optimizer at stages 1-3 (its zero_optimization.offload_optimizer); FSDP2's CPUOffloadPolicy
    and autoplan's optimizer offload shard with FSDP (ZeRO-1 to 3 by the plan rules)."""

    def __post_init__(self) -> None:
        # every estimate prints the name ("priced for runtime <name>"): a blank one reads as none
        if not isinstance(self.name, str) or not self.name.strip():
            _refuse("name", self.name, "give the runtime a name, or leave name out of a file "
                                       "with a base to be called <base>+<file stem>")
        self._check_numbers()
        self._check_choices()
        self._check_lists()

    def _check_numbers(self) -> None:
        """Byte counts, fractions, factors and SM counts in their ranges."""
        if not 0.0 <= self.optimizer_extra_bytes <= 64.0:
            _refuse("optimizer_extra_bytes", self.optimizer_extra_bytes,
                    "expected 0 to 64 bytes per sharded parameter")
        if not 0.0 <= self.fp8_weight_cache_bytes <= 4.0:
            _refuse("fp8_weight_cache_bytes", self.fp8_weight_cache_bytes,
                    "expected 0 to 4 bytes")
        for f in ("grad_bytes_bf16", "grad_bytes_fp16", "reduce_bytes_bf16", "reduce_bytes_fp16",
                  "logit_bytes_saved", "logit_bytes_transient"):
            if not 0 < getattr(self, f) <= 8:
                _refuse(f, getattr(self, f), "expected bytes in (0, 8]")
        floor = LOSS_CAST_BYTES if self.loss_casts else 0.0
        if not floor < self.loss_bytes_per_logit <= 256.0:
            _refuse("loss_bytes_per_logit", self.loss_bytes_per_logit,
                    f"expected bytes in ({floor:g}, 256]"
                    + (" (the casts alone move that much; loss_casts: false for a kernel "
                       "without them)" if self.loss_casts else ""))
        if isinstance(self.fp8_gemm_efficiency, bool) or not isinstance(
                self.fp8_gemm_efficiency, (int, float)) or not 0.1 <= self.fp8_gemm_efficiency <= 1.5:
            _refuse("fp8_gemm_efficiency", self.fp8_gemm_efficiency,
                    "expected a factor from 0.1 to 1.5 on the profile's fp8 GEMM speed")
        for f in ("tp_comm_overlap", "ep_comm_overlap"):
            if not 0.0 <= getattr(self, f) <= 1.0:
                _refuse(f, getattr(self, f), "expected a fraction from 0 to 1")
        if self.ep_dispatch_bytes is not None and not 0 < self.ep_dispatch_bytes <= 4:
            _refuse("ep_dispatch_bytes", self.ep_dispatch_bytes,
                    "expected bytes in (0, 4], or null")
        for f in ("comm_reserved_sms", "userbuffers_proj_sms", "userbuffers_fc2_sms"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
                _refuse(f, value, "expected a whole number of SMs from 0 to 1024")

    def _check_choices(self) -> None:
        """Fields that name one of a few kinds."""
        if not isinstance(self.dualpipe, bool):
            _refuse("dualpipe", self.dualpipe, "expected true or false")
        for field, allowed in (("ep_dispatcher", EP_DISPATCHERS),
                               ("cp_exchange", CP_EXCHANGES),
                               ("tp_comm_overlap_method", TP_OVERLAP_METHODS),
                               ("attention_kernel", ATTENTION_KERNELS)):
            if getattr(self, field) not in allowed:
                _refuse(field, getattr(self, field),
                        "choose " + (" or " if len(allowed) == 2 else ", ").join(allowed))
        if self.attention_compute_dtype not in (None, "fp32"):
            _refuse("attention_compute_dtype", self.attention_compute_dtype,
                    "choose fp32, or null for the plan's precision")
        if self.ep_dispatcher == "allgather":
            # Megatron's validate_args: --overlap-moe-expert-parallel-comm needs the alltoall or
            # flex dispatcher; the allgather dispatcher gathers 16-bit activations, unquantized
            if self.ep_comm_overlap:
                _refuse("ep_comm_overlap", self.ep_comm_overlap, "the allgather dispatcher "
                        "overlaps nothing (Megatron: alltoall or flex only): set 0")
            if self.ep_dispatch_bytes is not None:
                _refuse("ep_dispatch_bytes", self.ep_dispatch_bytes, "the allgather "
                        "dispatcher sends the activations as they are: leave it null")

    def _check_lists(self) -> None:
        """Lists of what the runtime has: each member known, and the required ones there."""
        known = ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble")
        _check_list("schedules", self.schedules, known, f"list some of {', '.join(known)}",
                    nonempty=True)
        _check_list("multi_stage_schedules", self.multi_stage_schedules, self.schedules,
                    f"list some of runtime.schedules ({', '.join(self.schedules)})")
        _check_list("offload", self.offload, OFFLOAD_MODES,
                    "list some of optimizer, params, both (or [] for none)")
        _check_list("offload_zero_stages", self.offload_zero_stages, (1, 2, 3),
                    "list some of the ZeRO stages 1, 2, 3 (an optimizer offload needs a "
                    "sharded optimizer)", nonempty=True, whole=True)
        splits = ("even", "balanced", "ends", "embed-loss", "deepspeed")
        _check_list("layer_splits", self.layer_splits, splits,
                    f"list even and any of {', '.join(splits[1:])}", required="even")
        modules = ("core_attn", "mlp", "layernorm", "moe_act", "moe")
        _check_list("recompute_modules", self.recompute_modules, modules,
                    f"list some of {', '.join(modules)} (or [] for none)")
        _check_list("grad_reduce_dtypes", self.grad_reduce_dtypes, ("fp32", "bf16"),
                    "list some of fp32, bf16 (or [] for the runtime's own default only)")
        _check_list("hsdp_zero_stages", self.hsdp_zero_stages, (1, 2, 3),
                    "list some of 1, 2, 3 (or none)")
        _check_list("parallel_dims", self.parallel_dims, ("tp", "pp", "cp", "ep"),
                    "list some of tp, pp, cp, ep (or [] for data parallel only)")
        _check_list("precisions", self.precisions, ("bf16", "fp16", "fp32", "fp8"),
                    "list some of bf16, fp16, fp32, fp8", nonempty=True)
        _check_list("model_code", self.model_code, ("moe", "mla", "mtp"),
                    "list some of moe, mla, mtp (or [] for dense models only)")
        _check_list("recompute_policies", self.recompute_policies, ("none", "selective", "full"),
                    "list none and any of selective, full", required="none")
        _check_list("zero_stages", self.zero_stages, (0, 1, 2, 3), "list some of 0, 1, 2, 3",
                    nonempty=True)

    def offload_refusal(self, optimizer: bool, params: bool,
                        zero_stage: int | None = None) -> str | None:
        """Why the runtime cannot run this offload (at this ZeRO stage, where given), or None."""
        mode = {(True, True): "both", (True, False): "optimizer", (False, True): "params"}.get(
            (optimizer, params))
        if mode is None:
            return None
        if mode not in self.offload:
            runs = "; ".join(OFFLOAD_MODES[m] for m in self.offload) or "nothing"
            return f"runtime {self.name} cannot offload {OFFLOAD_MODES[mode]} (it offloads {runs})"
        if optimizer and zero_stage is not None and zero_stage not in self.offload_zero_stages:
            stages = ", ".join(map(str, self.offload_zero_stages))
            return (f"runtime {self.name} offloads the optimizer at ZeRO stage {stages} only "
                    f"(got zero_stage {zero_stage}; set zero_stage {self.offload_zero_stages[0]})")
        # the least stage each mode needs is a plan rule (plan_rules, offload-*)
        return None

    def tp_exposed_share(self, tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """Share of a block's tensor-parallel collective time left exposed, as far as the GEMMs
        beside it are long enough to hide the rest (the caller caps the hidden time by them).

        `userbuffers` follows Transformer Engine's default overlap methods per GEMM
        (transformer_engine/pytorch/module/base.py, initialize_ub: ring_exchange for qkv_fprop,
        fc1_fprop, proj_dgrad, fc2_dgrad; pipeline for proj_fprop, fc2_fprop; bulk for the
        qkv/fc1 dgrad and wgrad). A block runs ten sequence-parallel collectives of equal size
        (forward: 2 all-gathers, 2 reduce-scatters; backward: 2 all-gathers of the output
        gradient, 2 re-gathers of the norm outputs, 2 reduce-scatters of the input gradients),
        of which the cost model prices eight (comm.tensor_parallel_collectives' "layer": the
        re-gathers, bulk-overlapped wherever Megatron re-gathers, are never exposed). A ring
        exchange leaves its first of tp chunks exposed, a pipelined reduce-scatter its last of
        num_splits = 4 (Megatron-Bridge's userbuffers presets), a bulk overlap none: exposed
        = (4/tp + 2/4) collectives of the eight priced. Userbuffers needs sequence parallelism
        (Megatron-Bridge refuses tp_comm_overlap without it)."""
        tp, sp = np.asarray(tp, float), np.asarray(sp, bool)
        # async dgrad: of a block's 4 all-reduces (forward: attention and MLP outputs;
        # backward: the QKV and fc1 input gradients) the 2 backward ones hide behind their
        # weight-gradient GEMMs; with SP, 2 of its 8 collectives (the input-gradient
        # reduce-scatters). Userbuffers runs on the same Transformer Engine modules and falls
        # back to it where it does not apply (no SP).
        async_dgrad = np.where(sp, 6.0 / 8.0, 2.0 / 4.0) + np.zeros_like(tp)
        if self.tp_comm_overlap_method == "userbuffers":
            exposed = (4.0 / np.maximum(tp, 1.0) + 2.0 / 4.0) / 8.0
            return np.where(_userbuffers_apply(tp, sp), exposed, async_dgrad)
        if self.tp_comm_overlap_method == "async-dgrad":
            return async_dgrad
        return np.full_like(tp, 1.0 - self.tp_comm_overlap)

    def tp_async_dgrad(self, tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """Where the overlap is async dgrad, which hides only behind the column-parallel GEMMs'
        weight gradients (userbuffers without SP falls back to it)."""
        tp = np.asarray(tp, float)
        if self.tp_comm_overlap_method == "userbuffers":
            return ~_userbuffers_apply(tp, sp)
        return np.full(tp.shape, self.tp_comm_overlap_method == "async-dgrad")

    def tp_recompute_exposed_share(self, tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """The same for the forward collectives a recompute repeats: userbuffers overlaps them
        as it does the first forward; async dgrad overlaps backward collectives only."""
        tp = np.asarray(tp, float)
        if self.tp_comm_overlap_method == "userbuffers":
            return np.where(_userbuffers_apply(tp, sp), self.tp_exposed_share(tp, sp), 1.0)
        if self.tp_comm_overlap_method == "async-dgrad":
            return np.ones_like(tp)
        return self.tp_exposed_share(tp, sp)

    def attention_precision(self, precision: str) -> str:
        """The precision a plan's fused attention core runs in: fp8 runs keep attention in
        bf16 (Transformer Engine, torchao: fp8 GEMMs only), and `attention_compute_dtype`, where
        set, replaces a 16-bit one."""
        core = "bf16" if precision == "fp8" else precision
        if self.attention_compute_dtype is not None and core in ("bf16", "fp16"):
            return self.attention_compute_dtype
        return core

    def grad_bytes(self, precision: str) -> float:
        """Bytes per gradient element kept on the device (fp8 runs keep bf16's)."""
        if precision == "fp32":
            return 4.0
        return self.grad_bytes_fp16 if precision == "fp16" else self.grad_bytes_bf16

    def loss_bytes(self, precision: str) -> float:
        """loss_bytes_per_logit for this precision: fp32 logits need no upcast forward and no
        cast back (LOSS_CAST_BYTES fewer); a kernel without casts moves twice the bytes."""
        if precision != "fp32":
            return self.loss_bytes_per_logit
        if self.loss_casts:
            return self.loss_bytes_per_logit - LOSS_CAST_BYTES
        return 2.0 * self.loss_bytes_per_logit

    def reduce_bytes(self, precision: str) -> float:
        """Bytes per gradient element sent in data-parallel reductions."""
        if precision == "fp32":
            return 4.0
        return self.reduce_bytes_fp16 if precision == "fp16" else self.reduce_bytes_bf16


TP_OVERLAP_METHODS = ("none", "async-dgrad", "userbuffers")
"""RuntimeTraits.tp_comm_overlap_method values."""
EP_DISPATCHERS = ("alltoall", "deepep", "allgather")
"""RuntimeTraits.ep_dispatcher's kinds."""
CP_EXCHANGES = ("all-gather", "torch-ring")
ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "fa-triton", "sdpa-cpu")
"""RuntimeTraits.attention_kernel values."""


def _userbuffers_apply(tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
    """Where Transformer Engine's userbuffers overlap runs: sequence parallelism at tp >= 2
    (elsewhere its modules fall back to async dgrad)."""
    return np.asarray(sp, bool) & (np.asarray(tp, float) > 1)


def runtime_from_dict(data: Any, where: str = "runtime", source: str | None = None
                      ) -> RuntimeTraits:
    """RuntimeTraits from a mapping of its fields; `base: <preset>` starts from that preset's
    fields, which the mapping's own then override (e.g. megatron with bf16 gradients). Without a
    `name` the traits take the preset's, or `<base>+<source>` where they come from a file
    (`source`: its stem), so a customised file is never labelled as the untouched preset."""
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {data!r}", "expected a mapping of runtime-traits fields")
    data = dict(check_schema_version(data, where))
    if "base" in data:
        base = data.pop("base")
        # a list or mapping is unhashable: check it is a name before looking it up
        if not isinstance(base, str) or base not in RUNTIME_PRESETS:
            raise ConfigError(f"{where}.base",
                              f"unknown preset {base!r}" if isinstance(base, str)
                              else f"got {show(base)}",
                              f"choose one of {', '.join(RUNTIMES)}")
        name = base if source is None else f"{base}+{source}"
        data = {"name": name, **RUNTIME_PRESETS[base], **data, "base": base}
    try:
        return from_dict(RuntimeTraits, data, "runtime")
    except ConfigError as err:
        # the field checks name `runtime.<field>`: said under `where` once (`--runtime.<field>`)
        if where == "runtime" or not err.field.startswith("runtime"):
            raise
        raise ConfigError(where + err.field[len("runtime"):], err.problem, err.fix) from None


def _names_a_file(ref: str) -> bool:
    """A --runtime value meant as a file (a path separator, a .yaml/.yml suffix in any case, or
    something there by that name), so that a missing or unreadable one is reported as such and
    not as an unknown preset."""
    if "/" in ref or os.sep in ref or Path(ref).suffix.lower() in (".yaml", ".yml"):
        return True
    try:
        return Path(ref).exists()
    except OSError:  # a name past NAME_MAX: no file, so an unknown preset
        return False


def load_runtime(ref: str | Path | RuntimeTraits | None, flag: str = "--runtime",
                 on_cpu: bool = False) -> RuntimeTraits:
    """A preset by name (see RUNTIMES), a YAML file of RuntimeTraits fields, or the default:
    autoplan's own runtime on the profile's kind of device (`on_cpu`; `autoplan` alike)."""
    if isinstance(ref, RuntimeTraits):
        return ref
    if ref is None or ref == "autoplan":
        ref = "autoplan-cpu" if on_cpu else "autoplan-cuda"
    name = str(ref)
    if name in RUNTIME_PRESETS:
        return runtime_from_dict({"schema_version": 1, "name": name, **RUNTIME_PRESETS[name]}, flag)
    if not _names_a_file(name):
        raise ConfigError(flag, f"unknown runtime {name!r}", "choose one of autoplan, "
                          f"{', '.join(RUNTIMES)} or a path to a traits YAML")
    path = Path(name)
    traits = runtime_from_dict(read_yaml(path, flag), flag, source=path.stem)
    # a file that calls itself a preset must be that preset, or its estimates read as the preset's
    if traits.name in RUNTIME_PRESETS and replace(traits, base=None) != load_runtime(traits.name):
        raise ConfigError(f"{flag}.name", f"got {traits.name!r}, a preset these traits differ "
                          "from", "choose a name of your own, or leave name out to be called "
                          "<base>+<file stem>")
    return traits
