"""The keys DeepSpeed defines in the config sections `import --from deepspeed` reads, which it
refuses any other key in, and the optimizer types whose states autoplan prices."""

from __future__ import annotations

_OFFLOAD_KEYS = frozenset({"device", "nvme_path", "buffer_count", "pin_memory"})
_BF16_KEYS = frozenset({"enabled", "immediate_grad_update", "check_grad_overflow",
                        "check_overflow", "bf16_master_weights_and_grads",
                        "bf16_optimizer_states"})
SECTION_KEYS: dict[str, frozenset[str]] = {
    "zero_optimization": frozenset({
        "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
        "use_multi_rank_bucket_allreduce", "allgather_partitions", "allgather_bucket_size",
        "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint", "offload_param",
        "offload_optimizer", "sub_group_size", "cpu_offload_param", "cpu_offload_use_pin_memory",
        "cpu_offload", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
        "param_persistence_threshold", "stage3_param_persistence_threshold",
        "model_persistence_threshold", "stage3_model_persistence_threshold",
        "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance",
        "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save",
        "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
        "module_granularity_threshold", "stage3_module_granularity_threshold",
        "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
        "allgather_sequential", "stage3_allgather_sequential", "partition_stream_chunk_size",
        "stage3_partition_stream_chunk_size", "ignore_unused_parameters", "legacy_stage1",
        "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
        "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param",
        "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear",
        "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings",
        "enable_sanity_checks", "save_muon_momentum_buffer_in_memory", "leaf_module", "zenflow",
        "compute_grad_norm", "parameter_alignment"}),
    "zero_optimization.offload_param": _OFFLOAD_KEYS | {"buffer_size", "max_in_cpu"},
    "zero_optimization.offload_optimizer": _OFFLOAD_KEYS | {
        "pipeline_read", "pipeline_write", "fast_init", "ratio", "cpuadam_cores_perc",
        "super_offload"},
    "bf16": _BF16_KEYS,
    "bfloat16": _BF16_KEYS,
    "fp16": frozenset({"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                       "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                       "min_loss_scale", "fp16_master_weights_and_grads"}),
    "tensor_parallel": frozenset({
        "autotp_size", "dtype", "tensor_parallel", "tp", "injection_policy_tuple",
        "keep_module_on_host", "kernel_inject", "partition_config", "preset_model",
        "replace_with_kernel_inject", "tp_overlap_comm", "vocab_parallel_ce_backend",
        "vocab_parallel_lm_head"}),
}
"""The keys of the DeepSpeed sections we read that DeepSpeed models with pydantic
(DeepSpeedConfigModel, extra="forbid": runtime/zero/config.py, zero/offload_config.py,
precision_config.py, tensor_parallel/config.py), which refuse any other key; each set is the
union over DeepSpeed releases (0.19.8 and earlier: mics_*, which 0.19 removed; check_overflow of
the releases that read bf16 as a plain dict), aliases (stage3_*) and deprecated names included.
pipeline, activation_checkpointing and amp are plain dicts to DeepSpeed: any key goes."""


DEEPSPEED_ADAM = ("adam", "adamw", "muadam", "muadamw")
"""optimizer.type values (case folded, as runtime/config.py folds DeepSpeed's own optimizers)
that run Adam's states: Adam and AdamW, and muP's MuAdam and MuAdamW (Adam with per-width
learning rates)."""
