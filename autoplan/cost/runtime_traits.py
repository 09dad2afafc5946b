"""RuntimeTraits: what the software that runs a plan does apart from the hardware (fused kernels,
recompute, gradient dtypes, overlaps, schedules, host costs), one documented field each; checked
by runtime_checks.py, read for a plan by runtime_pricing.py, named in runtime_presets.py."""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.runtime_checks import check_traits
from autoplan.cost.runtime_kinds import PipelineGradSync, SelectiveKind
from autoplan.cost.runtime_pricing import TraitsPricing


@dataclass(frozen=True)
class RuntimeTraits(TraitsPricing):
    """The software side of the cost model (DESIGN.md section 6: hardware x runtime x plan).

    The same plan costs different memory and time under Megatron-Core and under autoplan's
    runtime: which kernels are fused, what selective recompute keeps, which dtype gradients are
    reduced in, which communication overlaps and which schedules exist. Host costs per op stay in
    the hardware profile (measured on one machine by `autoplan profile`); a runtime says whether
    it pays them (`eager_host_overheads`) and whether its host runs ahead of the device
    (`host_runs_ahead`: then they cost only what the kernels do not cover)."""

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
    grad_accumulate_bytes: float = 0.0
    """HBM bytes per parameter the runtime moves after every micro-batch's backward to add the
    16-bit gradients of all its parameters into an accumulator of its own, on the compute
    stream between micro-batches (nothing hides it): nanotron's FP32GradientAccumulator.backward
    loops over every parameter tensor, `fp32_grad.add_(half.grad)` (read 2 + 4, write 4: 10;
    huggingface/nanotron src/nanotron/optim/gradient_accumulator.py, accumulate_grad_in_fp32).
    0: gradients accumulate in place (gradient_accumulation_fusion, FSDP2) or only the
    embedding's is added (adds_into_grad_buffer). DeepSpeed's pipeline engine has its own
    (pipeline_engine_reduce)."""
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
    group across nodes sends moe_dispatch.node_dedup_share of the copies through the NICs.
    `allgather`: every token to every rank of the expert-TP x EP group, each keeping those for
    its experts, and the outputs reduce-scattered back (Megatron-Core
    --moe-token-dispatcher-type allgather, its default; moe_dispatch.all_gather_dispatch_s),
    through a gather buffer it keeps (moe_dispatch.all_gather_buffer_bytes)."""
    cp_exchange: str = "all-gather"
    """How context parallelism brings each rank the K/V of the whole sequence. `all-gather`: one
    all-gather of the grouped K/V heads before attention and a reduce-scatter of their gradients
    after it, both exposed (autoplan's runtime, runtime/context_parallel.py; Llama 3's stack,
    Dubey et al. 2024 §3.3.2: "the all-gather communication latency is exposed in the critical
    path"). `torch-ring`: PyTorch's ring attention (context_parallel, as torchtitan runs it):
    K/V as SDPA sees them (repeated where `kv_repeated`) all-gathered behind the first ring
    step, fp32 dK/dV passed around the ring behind each backward step, and the fp32 merges of
    the per-step outputs and gradients (comm.torch_ring_time_s,
    elementwise.torch_ring_elementwise_bytes). `te-p2p`: Transformer Engine's P2P ring
    (AttnFuncWithCPAndKVP2P, cp_comm_type "p2p", Megatron-Core's default): 2cp load-balanced
    chunks, the grouped K/V heads sent to the next rank behind each step's kernel, 16-bit
    dK/dV passed along the ring, 16-bit output merges (cost/te_ring.py)."""
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
    FlashAttention-2 figures (attention_kernels.TRITON_FA_SLOWDOWN). sdpa-cpu: torch's CPU
    flash kernel, whose speed a CPU profile files per dtype (profiler/precision.py)."""
    attention_compute_dtype: str | None = None
    """The dtype the fused attention core computes in for a 16-bit plan. None: the plan's own.
    fp32: autoplan's CPU runtime casts Q, K, V to fp32 for SDPA and the output back
    (runtime/models/layers.py Attention.core), because torch's CPU flash-attention backward in
    bf16 runs 9-45x slower than in fp32 at the tiny block's call while the casts cost ~0.2x of
    the fp32 core (measured by profiler/precision.py); priced at the profile's
    `attention_kernel@fp32` figures and fp32 peak, plus the casts' bytes
    (attention_precision, elementwise.attention_cast_bytes)."""
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
    device memory: elementwise.EAGER_BYTES_PER_TOKEN, counted on autoplan's block); False: fused
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
    """Speed of the runtime's FP8 GEMM kernels over what the profile prices an FP8 GEMM at (the
    curve at the fp8 peak times the profile's cuBLASLt figure, Efficiency.fp8_matmul; FP8
    plans only). 1: cuBLASLt's kernels (Transformer Engine's per-tensor FP8, torchao's
    Float8Linear through torch._scaled_mm). DeepSeek-V3's fine-grained FP8 (1x128 activation
    tiles, 128x128 weight blocks, partial sums promoted to CUDA cores every 128 K elements:
    report §3.3.2) is slower: the ratio of a kernel's measured TFLOPS to the profile's price,
    time-weighted over a model's GEMMs, is derived from the DeepGEMM README's table
    (benchmarks/deepgemm_fp8.py). Backward GEMMs (Dgrad, Wgrad) are taken at the forward
    shapes' factor: no source tabulates them."""
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
    train_metric_passes: int = 0
    """Cross-entropy forwards over the logits the trainer runs every micro-batch for its
    training metrics, beside the loss (priced in time at runtime_kinds.METRIC_PASS_BYTES per
    logit each, with the loss: loss_bytes). 2: Composer, as MosaicML's MPT tables ran it: the
    model's train metrics are LanguageCrossEntropy and LanguagePerplexity (mosaicml/examples
    mosaic_gpt.py ComposerMosaicGPT, llm-foundry's ComposerMPTCausalLM, use_train_metrics
    true by default), Composer's Trainer._train_microbatch updates every train metric after
    each micro-batch's backward under the run's autocast (_eval_train_metrics), and
    LanguagePerplexity subclasses LanguageCrossEntropy, so its update runs the
    torch.nn.CrossEntropyLoss again. In memory, after each micro-batch's backward has freed its
    activations, the stage with the loss holds runtime_kinds.METRIC_PASS_LIVE_BYTES per logit
    beside the micro-batches still in flight (step_memory.stage_activation_bytes): for small
    models with large micro-batches that, not backward, is the step's peak."""
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
        """Refuse a blank name or an out-of-range field (runtime_checks.check_traits)."""
        check_traits(self)
