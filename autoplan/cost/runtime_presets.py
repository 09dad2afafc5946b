"""Runtime-traits presets by name: autoplan's own runtime (CUDA, CPU), Megatron-LM/Core and NeMo,
torchtitan, DeepSpeed, llm-foundry and nanotron, each as the release or published runs it names
used it; a field a preset leaves out takes the RuntimeTraits default (runtime_traits.py)."""

from __future__ import annotations

from typing import Any

_MEGATRON_CORE: dict[str, Any] = {
    "optimizer_extra_bytes": 10.0, "adds_into_grad_buffer": True, "zeroes_grad_buffer": True,
    "reentrant_recompute": True, "logit_bytes_transient": 4.0, "grads_in_reduce_dtype": True,
    "loss_bytes_per_logit": 52.0,
    "partial_selective": False,
}
"""What every Megatron preset shares (each field's docstring cites the code)."""

_MEGATRON_2021: dict[str, Any] = {
    **_MEGATRON_CORE,
    "description": "Megatron-LM as the SC21 runs used it (examples/sc21 at de7dc40f88, PyTorch "
                   "NGC 20.12): the data-parallel all-reduce runs after backward (train_step "
                   "calls allreduce_gradients once backward is done), tensor-parallel "
                   "all-reduces in line with the GEMMs, no overlap; fused LayerNorm",
    "selective": "attention-core", "zero_stages": [0, 1], "offload": [],
    "hsdp_zero_stages": [],  # no distributed optimizer instances in the 2021-22 code
    # sequence parallelism and selective recompute came with the 2022 release (Korthikanti et
    # al. 2022: --sequence-parallel, --recompute-granularity selective); the SC21 code
    # checkpoints whole layers (--checkpoint-activations) or none
    "has_sequence_parallel": False, "recompute_policies": ["none", "full"],
    "recompute_modules": [], "fused_attention": False,
    "schedules": ["1f1b", "interleaved-1f1b"], "overlap_dp_comm": False,
    "overlap_param_gather": False, "pipeline_scatter_gather": True,
}
"""Megatron-LM's 2021 code (the SC21 runs); its 2022 release starts from it."""

_TORCHTITAN: dict[str, Any] = {
    "description": "torchtitan as its published runs used it (eager, no torch.compile; "
                   "its own unfused RMSNorm, priced as composite): FSDP2 (fp32 sharded "
                   "params, fp32 reduce), DTensor TP/SP, torch.distributed.pipelining, "
                   "op-level selective "
                   "checkpointing, eager SwiGLU, SDPA's FlashAttention-2",
    "fused_swiglu": False, "fused_norm": False, "eager_elementwise": True,
    "fp8_weight_cache_bytes": 0.0,
    "selective": "op-sac", "fp32_sharded_params": True, "fsdp2_copies": True,
    "grad_bytes_fp16": 4.0, "reduce_bytes_fp16": 4.0, "offload": ["both"],
    "partial_recompute": False,
    "fsdp2_offload": True,
    # FSDP2 has no optimizer-only sharding: torchtitan replicates (DDP, ZeRO-0), or shards
    # with reshard_after_forward False (ZeRO-2) or True (ZeRO-3) (export/torchtitan.py)
    "zero_stages": [0, 2, 3], "hsdp_zero_stages": [2, 3], "grad_reduce_dtypes": ["fp32"],
    "multi_stage_schedules": ["zero-bubble"], "recompute_modules": [],
    # Attention.forward repeats the grouped K/V heads before SDPA (repeat_kv: unsqueeze,
    # expand, reshape, which copies) and the flash kernel saves those copies for backward
    # (torchtitan/models/llama/model.py, 2024 through its 2025 llama3 model)
    "kv_repeated": True,
    # context parallelism is PyTorch's ring attention (torchtitan's
    # create_context_parallel_ctx, context_parallel_rotate_method "allgather")
    "cp_exchange": "torch-ring", "ddp_one_dimensional": True,
    "sequence_parallel_with_tp": True, "mixed_precision_needs_fsdp": True,
}
"""torchtitan as its published runs (2024-25) used it; 0.3.0 starts from it."""

_MEGATRON_TE: dict[str, Any] = {
    **_MEGATRON_CORE, "transformer_engine": True, "tp_comm_overlap_method": "async-dgrad",
    "chunked_dp_sync": True,
    "attention_kernel": "cudnn",
    "selective": "attention-core", "zero_stages": [0, 1, 2, 3], "offload": ["optimizer"],
    "offload_zero_stages": [1],  # the distributed optimizer's (HybridDeviceOptimizer)
    "sharded_zero_with_pipeline": False,
    "schedules": ["1f1b", "interleaved-1f1b"], "hsdp_zero_stages": [1],
    # context parallelism through TE's P2P ring: Megatron-Core's TEDotProductAttention passes
    # cp_comm_type "p2p" where none is set (megatron/core/extensions/transformer_engine.py, TE
    # >= 1.10; the only kind before), --cp-comm-type's default (megatron/training/arguments.py)
    "cp_exchange": "te-p2p",
}
"""Megatron-Core with Transformer Engine, as `export --to megatron` runs it (the MoE alltoall
dispatcher); the megatron-* presets differ from it in their MoE dispatcher alone."""

RUNTIME_PRESETS: dict[str, dict[str, Any]] = {
    "megatron": {
        **_MEGATRON_TE,
        "description": "Megatron-LM / Megatron-Core with Transformer Engine: fused norms, SwiGLU "
                       "and attention, selective = attention core, distributed optimizer (ZeRO-1) "
                       "with overlapped gradient reduce and parameter gather, Megatron-FSDP "
                       "(ZeRO-2/3) without a pipeline",
    },
    "megatron-deepep": {
        **_MEGATRON_TE,
        "description": "as megatron, with the MoE flex dispatcher on DeepEP "
                       "(--moe-token-dispatcher-type flex --moe-enable-deepep): tokens sent "
                       "once per destination node",
        "ep_dispatcher": "deepep",
    },
    "megatron-allgather": {
        **_MEGATRON_TE,
        "description": "as megatron, with the MoE allgather dispatcher (--moe-token-dispatcher-"
                       "type allgather, Megatron's default): every token gathered over the "
                       "expert-TP x EP group, the outputs reduce-scattered back",
        "ep_dispatcher": "allgather",
    },
    "megatron-2021": _MEGATRON_2021,
    # The 2022 release (sequence parallelism and selective recompute, Korthikanti et al. 2022)
    # added to the 2021 code its column-parallel backward that launches the input-gradient
    # all-reduce asynchronously and computes the weight gradient while it runs
    # (megatron/mpu/layers.py, LinearWithGradAccumulationAndAsyncCommunication; on unless
    # --no-async-tensor-model-parallel-allreduce); with sequence parallelism the same backward
    # re-gathers the saved input shard behind the input-gradient GEMM and reduce-scatters the
    # input gradient behind the weight-gradient GEMM: async dgrad's overlap either way
    "megatron-2022": {
        **_MEGATRON_2021,
        "description": "Megatron-LM as the Korthikanti et al. 2022 runs used it (the "
                       "selective-recompute release): as megatron-2021, with the column-"
                       "parallel input-gradient all-reduce (reduce-scatter under sequence "
                       "parallelism) run beside the weight-gradient GEMM",
        "tp_comm_overlap_method": "async-dgrad",
        "has_sequence_parallel": True, "recompute_policies": ["none", "selective", "full"],
    },
    "nemo": {
        **_MEGATRON_CORE, "transformer_engine": True, "chunked_dp_sync": True,
        "attention_kernel": "cudnn",
        "description": "NeMo / Megatron-Bridge recipes on Megatron-Core: as megatron, with "
                       "tensor-parallel communication overlapped with GEMMs (tp_comm_overlap, "
                       "Transformer Engine userbuffers)",
        "selective": "attention-core", "zero_stages": [0, 1, 2, 3], "offload": ["optimizer"],
        "offload_zero_stages": [1],  # the distributed optimizer's (HybridDeviceOptimizer)
        "sharded_zero_with_pipeline": False,
        "schedules": ["1f1b", "interleaved-1f1b"], "tp_comm_overlap_method": "userbuffers",
        "userbuffers_proj_sms": 24, "userbuffers_fc2_sms": 16,  # NeMo's H100 70B recipe
        "hsdp_zero_stages": [1],
        # NeMo 2 / Megatron-Bridge recipes leave cp_comm_type unset: Megatron-Core's p2p ring
        "cp_exchange": "te-p2p",
    },
    # torchtitan's RMSNorm (torchtitan/models/norms.py, until its PR #985 of 2025-03 made it
    # nn.RMSNorm) is `self._norm(x.float()).type_as(x) * self.weight`: it keeps the fp32 upcast
    # and the 16-bit normalised output (6 bytes per element; fused_norm False prices 8), which
    # matters only without activation checkpointing. Its April 2024 configs chose the Triton
    # "fused_rmsnorm" instead (saves x, weight, rstd: fused_norm True; PR #297 of 2024-05-02
    # changed train_configs/llama3_8b.toml from it to "rmsnorm").
    "torchtitan": _TORCHTITAN,
    # torchtitan 0.3.0 (the release export's Python config targets), read in its wheel: its
    # attention passes the grouped K/V heads to the kernel (models/common/attention.py,
    # enable_gqa), its context parallelism all-gathers them and reduce-scatters their gradients
    # (torch's flex_cp_allgather, _context_parallel/_cp_custom_ops.py), and FullAC wraps every
    # block with early_stop=False (distributed/activation_checkpoint.py). Its default attention
    # is FlexAttention, priced at FlashAttention-2's figures: no measured ratio between the two
    # was found
    "torchtitan-0.3": {
        **_TORCHTITAN,
        "description": "torchtitan 0.3.0, as `export --to torchtitan` (Python config) runs it: "
                       "as torchtitan, with grouped K/V heads, all-gather context parallelism "
                       "and full checkpointing without early stop",
        "kv_repeated": False, "cp_exchange": "all-gather", "recompute_early_stop": False,
        # FullAC wraps every block (distributed/activation_checkpoint.py has FullAC,
        # SelectiveAC and MemoryBudgetAC, no every-n-th-block option), and tensor parallelism
        # shards the norms only with enable_sequence_parallel
        "nth_block_recompute": False, "sequence_parallel_with_tp": False,
        "mixed_precision_needs_fsdp": False,
    },
    "deepspeed": {
        "optimizer_extra_bytes": 14.0, "loss_bytes_per_logit": 52.0,
        # its loss is the model code's (Megatron-DeepSpeed's vocab-parallel cross-entropy, or
        # a model's own F.cross_entropy): priced at torch's forward figure, as before
        "logit_bytes_transient": 6.0,
        "reentrant_recompute": True,
        "description": "DeepSpeed ZeRO (and Megatron-DeepSpeed 3D): 16-bit gradients reduced in "
                       "16-bit, fp32 master + Adam in the optimizer, pipeline engine 1F1B",
        "selective": "attention-core", "grad_bytes_bf16": 2.0, "reduce_bytes_bf16": 2.0,
        "pipeline_grad_sync": "every-microbatch", "schedules": ["1f1b"],
        "pipeline_engine_reduce": True,
        "pipeline_scatter_gather": True,  # PipelineEngine.is_pipe/grad_partitioned (TP > 1)
        "zero_stages": [0, 1, 2, 3], "hsdp_zero_stages": [],
        "layer_splits": ["even", "deepspeed"], "recompute_modules": [],
        # no ring context parallelism (DeepSpeed's sequence parallelism is Ulysses, an
        # all-to-all head split) and no Megatron-Core experts (DeepSpeed-MoE is its own model
        # code): what export/deepspeed.py and export/megatron_deepspeed.py refuse
        "parallel_dims": ["tp", "pp"], "model_code": [],
        "precisions": ["bf16", "fp16", "fp32"],
        # PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        # (deepspeed/runtime/pipe/engine.py asserts zero stage < 2)
        "sharded_zero_with_pipeline": False,
        # what `export --to deepspeed` writes (export/deepspeed.py, megatron_deepspeed.py): whole
        # blocks or none (activation_checkpointing; --checkpoint-activations checkpoints every
        # layer), never a count of layers per stage; selective (attention-core) only through
        # Megatron-DeepSpeed, with tp or pp > 1
        "selective_needs_model_parallel": True, "partial_recompute": False,
        "nth_block_recompute": False,
    },
    # MosaicML's llm-foundry / Composer as its published MPT throughput table ran (2023;
    # scripts/train/benchmarking/submit_benchmarks.py and the MosaicGPT model it trained):
    # attn_impl "triton" by default (FlashAttention's Triton kernel), loss_fn
    # "fused_crossentropy" by default (flash_attn.losses.cross_entropy: saves the 16-bit logits,
    # 2 bytes, and writes a 16-bit gradient, 2, in backward), low_precision_layernorm (torch's
    # native layer_norm kernel on 16-bit inputs), PyTorch FSDP FULL_SHARD with the sharded
    # parameters in fp32, non-reentrant activation checkpointing of whole blocks
    # (activation_checkpointing_reentrant False), everything else eager.
    "llm-foundry": {
        "description": "MosaicML llm-foundry / Composer (2023): PyTorch FSDP (FULL_SHARD or "
                       "SHARD_GRAD_OP, fp32 sharded params), whole-block activation "
                       "checkpointing, FlashAttention's Triton kernel, flash_attn's fused "
                       "cross-entropy, Composer's two train metrics (cross-entropies over the "
                       "logits) after every micro-batch, eager element-wise ops; no tensor, "
                       "pipeline or context parallelism",
        "attention_kernel": "fa-triton", "fused_norm": True, "fused_swiglu": False,
        "eager_elementwise": True, "fp8_weight_cache_bytes": 0.0,
        # Composer's FSDP mixed_precision: PURE reduces in bf16; DEFAULT's reduce dtype
        # changed across Composer releases (bf16 early in 2023, fp32 later): fp32 is the
        # default here and a plan may set grad_reduce_dtype bf16
        "fp32_sharded_params": True, "grad_bytes_fp16": 4.0, "reduce_bytes_fp16": 4.0,
        "logit_bytes_saved": 2.0, "logit_bytes_transient": 2.0,
        "loss_bytes_per_logit": 8.0, "loss_casts": False,
        # Composer's Trainer updates the model's two train metrics, each a torch cross-entropy
        # over the logits, after every micro-batch (runtime_traits.train_metric_passes)
        "train_metric_passes": 2,
        "zero_stages": [0, 2, 3], "hsdp_zero_stages": [2, 3],
        "grad_reduce_dtypes": ["fp32", "bf16"],
        "offload": ["both"],  # FSDP's CPUOffload: parameters, gradients and the step together
        "parallel_dims": [], "model_code": [], "recompute_policies": ["none", "full"],
        "partial_recompute": False,
        "nth_block_recompute": False,
        "recompute_early_stop": False,  # torch 1.13 (A100 table) and 2.0.1 (H100) predate it
        "recompute_modules": [], "multi_stage_schedules": [],
    },
    # Hugging Face nanotron as its old_bench sweep ran it (2024; the runs behind the Ultra-Scale
    # Playbook, config.yaml of each run): models/llama.py builds the block from TritonRMSNorm,
    # flash_attn's fused rotary embedding and flash_attn_varlen_func (grouped K/V read as they
    # are; dropout_p 0.0), an eager GLUActivation (split, silu, mul) and its own Column/Row
    # linears, in ALL_REDUCE mode (ParallelismArgs' default) or REDUCE_SCATTER mode (sharding
    # the residual stream over tp: sequence parallelism), collectives in line
    # (tp_linear_async_communication false);
    # the loss is tensor_parallel/functional.py's _ShardedCrossEntropy on .float() logits,
    # Megatron's vocab-parallel algorithm step for step (max, all-reduce, subtract, exp, sum,
    # divide; the fp32 softmax saved). optimizer: accumulate_grad_in_fp32 (FP32GradientAccumulator
    # adds each backward's 16-bit gradients into fp32 buffers that DDP reduces in fp32, then
    # the step writes the fp32 master back into the 16-bit parameters) and zero_stage 1
    # (ZeroDistributedOptimizer); pipeline engines OneForwardOneBackward and
    # AllForwardAllBackward (parallel/pipeline_parallel/engine.py), whose DDP sync runs in the
    # last micro-batch's backward (_get_bwd_context)
    "nanotron": {
        **_MEGATRON_CORE,
        "description": "Hugging Face nanotron (2024): its own tensor-parallel linears (all-"
                       "reduce mode, or reduce-scatter mode = sequence parallel; no async "
                       "overlap), 1F1B or "
                       "all-forward-all-backward pipeline engines, ZeRO-1 over DDP with fp32 "
                       "gradient accumulation, Triton RMSNorm, eager SwiGLU, FlashAttention-2",
        "reentrant_recompute": False, "partial_selective": True,
        "fused_norm": True, "fused_swiglu": False, "eager_elementwise": True,
        "fp8_weight_cache_bytes": 0.0, "attention_kernel": "fa2", "attention_dropout": False,
        "kv_repeated": False, "sp_gathered_gemm_inputs": True,
        "schedules": ["gpipe", "1f1b"], "multi_stage_schedules": [],
        "zero_stages": [0, 1], "hsdp_zero_stages": [], "offload": [],
        "grad_reduce_dtypes": ["fp32"], "parallel_dims": ["tp", "pp"], "model_code": [],
        "precisions": ["bf16", "fp32"], "recompute_policies": ["none", "full"],
        "recompute_modules": [], "partial_recompute": False, "nth_block_recompute": False,
        "layer_splits": ["even", "balanced"], "overlap_param_gather": False,
        # optim/gradient_accumulator.py FP32GradientAccumulator.backward: every parameter's
        # bf16 gradient added into its fp32 buffer after each micro-batch (10 bytes a
        # parameter), the embedding's among them, so no separate embedding add
        "grad_accumulate_bytes": 10.0, "adds_into_grad_buffer": False,
    },
    "autoplan-cuda": {
        "description": "autoplan's own runtime on CUDA: FSDP2 (fp32 sharded params, fp32 "
                       "reduce), DTensor TP/SP, torch.distributed.pipelining, selective keeps GEMM "
                       "and SDPA outputs, eager SwiGLU",
        "fused_swiglu": False, "selective": "all-but-gemms", "fp32_sharded_params": True,
        "grad_bytes_fp16": 4.0, "reduce_bytes_fp16": 4.0, "eager_elementwise": True,
        "fp8_weight_cache_bytes": 0.0, "fsdp2_offload": True, "kv_repeated": True,
        "own_runtime_rules": True, "eager_host_overheads": True, "host_runs_ahead": True,
        "fsdp2_copies": True, "moe_eager_tensors": True, "fp8_experts": False,
        "attention_dropout": False,
    },
    "autoplan-cpu": {
        "description": "autoplan's own runtime on CPU/gloo: as autoplan-cuda, with torch's "
                       "composite RMSNorm, measured eager host costs per op and SDPA's CPU "
                       "flash kernel (priced per dtype from the profile; 16-bit plans run it "
                       "in fp32)",
        "attention_kernel": "sdpa-cpu", "attention_compute_dtype": "fp32",
        "fused_norm": False, "fused_swiglu": False, "selective": "all-but-gemms",
        "eager_elementwise": True, "fp8_weight_cache_bytes": 0.0,
        "fp32_sharded_params": True, "eager_host_overheads": True, "fsdp2_offload": True,
        "kv_repeated": True, "fsdp2_copies": True,
        "grad_bytes_fp16": 4.0, "reduce_bytes_fp16": 4.0,
        "overlap_param_gather": False, "own_runtime_rules": True, "moe_eager_tensors": True,
        "fp8_experts": False, "attention_dropout": False,
    },
}
"""Each preset cites its runtime's defaults in RuntimeTraits' field docstrings
(runtime_traits.py); every field not set takes the RuntimeTraits default."""

RUNTIMES: tuple[str, ...] = tuple(RUNTIME_PRESETS)
