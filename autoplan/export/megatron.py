"""`--to megatron`: Megatron-LM `pretrain_gpt.py` arguments for a plan, as a launch script.

Parallel degrees, sequence parallelism, the (virtual) pipeline split, recompute, the distributed
optimizer (ZeRO-1) with overlapped communication and its CPU offload, Megatron-FSDP (ZeRO-2/3,
without a pipeline), batch sizes and the model's shape; precision and attention in
megatron_te.py, experts in megatron_moe.py. Data, tokenizer files and optimizer
hyper-parameters are not planned: append them to the script's arguments. The flag spellings
and the rules cited follow megatron/training/arguments.py (validate_args) at NVIDIA/Megatron-LM
000c4ac24f.
"""

from __future__ import annotations

import shlex

from autoplan.cost.runtimes import load_runtime
from autoplan.export.base import ExportOptions, ExportTarget, layout, layout_reasons, stage_layers
from autoplan.export.launch import (
    check_job_name,
    check_path_word,
    comment,
    continued,
    cuda_only_reasons,
    shell_join,
)
from autoplan.export.megatron_moe import moe_args, moe_reasons, rope_reasons, yarn_args
from autoplan.export.megatron_norms import norm_args
from autoplan.export.megatron_te import te_args, te_reasons
from autoplan.model_spec import (
    LLAMA3_ROPE_TYPE,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
    RopeScaling,
)
from autoplan.plan import Plan, RecomputeMethod, RecomputePolicy, Schedule

MEGATRON_OFFLOAD_STAGES = load_runtime("megatron").offload_zero_stages
"""ZeRO stages Megatron-Core offloads the optimizer at (RuntimeTraits.offload_zero_stages)."""
NULL_TOKENIZER_EXTRA = 1
"""Megatron's NullTokenizer adds one end-of-document token to --vocab-size."""
CUDA_ONLY = ("Megatron-LM trains on CUDA GPUs only (NCCL, Transformer Engine and its fused CUDA "
             "kernels)")


def length_lines(plan: Plan, model: ModelSpec, tool: str) -> list[str]:
    """The header's word on the run's length, which no plan holds and this export takes no
    --steps for: `tool` (Megatron-LM, Megatron-DeepSpeed) needs --train-iters or
    --train-samples, else update_train_iters computes train_samples // global_batch_size from
    None and fails (megatron/training/training.py; Megatron-DeepSpeed's megatron/training.py)."""
    gbs = plan.batch.global_batch_size
    return comment(
        f"{tool} needs the run's length, --train-iters N (optimizer steps, each of global "
        f"batch {gbs} x seq_len {model.seq_len} = {gbs * model.seq_len:,} tokens) or "
        "--train-samples N (sequences): with neither it fails at start (update_train_iters "
        "divides the missing --train-samples by the global batch). This export takes no "
        "--steps: `autoplan train --steps N` is --train-iters N.")


def _reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What Megatron cannot run of a plan the plan rules accept (sequence parallelism needs
    tp > 1, vpp > 1 an interleaved schedule, ... are plan rules, said once there)."""
    p, pipe, why = plan.parallel, plan.pipeline, []
    if plan.zero_stage >= 2 and p.dp_shard is not None:
        why.append(
            f"dp_shard with zero_stage={plan.zero_stage}: autoplan maps Megatron's hybrid "
            "sharding for the distributed optimizer (ZeRO-1) only; use zero_stage 1"
        )
    if plan.zero_stage >= 2 and p.pp > 1:
        why.append(
            f"zero_stage={plan.zero_stage} with pp={p.pp}: Megatron shards gradients and "
            "parameters with Megatron-FSDP, whose user guide documents no pipeline "
            "combination; use pp=1 or zero_stage 0/1"
        )
    if plan.offload.params:
        why.append("offload.params: Megatron has no parameter offload to host memory")
    if model.position == PositionKind.ROPE and not model.rope_theta.is_integer():
        why.append(f"model.rope_theta={model.rope_theta:g}: Megatron's --rotary-base takes an "
                   "integer (type=int); round it")
    if plan.offload.optimizer and plan.zero_stage >= 1 \
            and plan.zero_stage not in MEGATRON_OFFLOAD_STAGES:
        # the rule the megatron runtime traits price and search by (one rule set); at ZeRO-0
        # the plan rule offload-optimizer-needs-zero refuses it for every target
        why.append(
            "offload.optimizer: Megatron offloads the distributed optimizer only "
            f"(needs zero_stage {', '.join(map(str, MEGATRON_OFFLOAD_STAGES))})"
        )
    if p.pp > 1 and pipe.schedule in (Schedule.GPIPE, Schedule.ZERO_BUBBLE):
        why.append(f"schedule {pipe.schedule.value}: Megatron runs 1F1B or interleaved 1F1B")
    if model.mlp == MlpKind.GEGLU:
        why.append("mlp geglu: Megatron's arguments gate the MLP with SiLU only (--swiglu)")
    scaling = model.rope_scaling
    if (scaling is not None and scaling.rope_type == LLAMA3_ROPE_TYPE
            and _fixed_band(scaling) != MEGATRON_ROPE_BAND):
        why.append(f"model.rope_scaling {_fixed_band(scaling)} (low_freq_factor, "
                   "high_freq_factor, original_max_position_embeddings): Megatron-Core scales "
                   f"with {MEGATRON_ROPE_BAND} fixed (RotaryEmbedding._apply_scaling); only "
                   "the factor is a flag (--rope-scaling-factor)")
    rc = plan.recompute
    if rc.num_layers is not None and rc.policy != RecomputePolicy.FULL:
        why.append(
            f"recompute.num_layers={rc.num_layers} with policy {rc.policy.value}: "
            "Megatron counts recomputed layers for full recompute only"
        )
    return why + rope_reasons(model) + te_reasons(plan, model) + moe_reasons(plan, model)


MEGATRON_ROPE_BAND = (1.0, 4.0, 8192)
"""Llama 3.1's frequency band, which Megatron-Core's RoPE scaling fixes (megatron/core/models/
common/embeddings/rotary_pos_embedding.py RotaryEmbedding._apply_scaling: low_freq_factor 1,
high_freq_factor 4, original_max_position_embeddings 8192; --use-rope-scaling turns it on and
--rope-scaling-factor, default 8, sets the factor)."""


def _fixed_band(scaling: RopeScaling) -> tuple[float | None, float | None, int | None]:
    return (scaling.low_freq_factor, scaling.high_freq_factor,
            scaling.original_max_position_embeddings)


def layout_string(split: tuple[int, ...], mtp_layers: int = 0) -> str:
    """--pipeline-model-parallel-layout: E embedding, t per layer, m per multi-token-prediction
    layer, L loss, '|' between stages; a first or last stage of no layer is "E" or "L" alone
    (Megatron-Core's PipelineParallelLayerLayout, megatron/core/transformer/
    pipeline_parallel_layer_layout.py: stages may be empty, E first and L last exactly once;
    validate_layer_layout: as many m as --mtp-num-layers, after every t, all in one last
    virtual stage: here the last stage's, before L)."""
    chunks = [f"t*{n}" if n else "" for n in split]
    chunks[0] = "E" + chunks[0]
    chunks[-1] += (f"m*{mtp_layers}" if mtp_layers else "") + "L"
    return "|".join(chunks)


def megatron_args(plan: Plan, model: ModelSpec) -> list[str]:
    """Flags for a plan that `check` accepted, grouped as Megatron's argument groups are."""
    p, pipe, rc = plan.parallel, plan.pipeline, plan.recompute
    a = [
        f"--tensor-model-parallel-size {p.tp}",
        f"--pipeline-model-parallel-size {p.pp}",
        f"--context-parallel-size {p.cp}",
    ]
    if plan.sequence_parallel:
        a.append("--sequence-parallel")
    split = stage_layers(plan, model)
    if p.pp > 1 and split is not None:
        if pipe.layers_per_stage is not None and len(set(split)) > 1:
            # The layout's stage count sets vpp; Megatron allows no second vpp flag with it.
            a.append("--pipeline-model-parallel-layout "
                     + layout_string(split, model.mtp_layers))
        elif pipe.vpp > 1:
            a.append(f"--num-layers-per-virtual-pipeline-stage {split[0]}")
    if plan.zero_stage >= 2:  # Megatron-FSDP's required flags (docs/discussions/
        # megatron-fsdp-user-guide): optim_grads = ZeRO-2, optim_grads_params = ZeRO-3
        a += ["--use-megatron-fsdp", "--use-distributed-optimizer",
              "--data-parallel-sharding-strategy "
              + ("optim_grads_params" if plan.zero_stage == 3 else "optim_grads"),
              "--no-gradient-accumulation-fusion", "--ckpt-format fsdp_dtensor"]
    if plan.zero_stage <= 1:  # bucketed gradient reduce overlapped with backward, as the
        # megatron runtime prices it (overlap_dp_comm); Megatron's default is off
        a.append("--overlap-grad-reduce")
    if plan.zero_stage == 1:
        # the parameter all-gather overlapped with forward (overlap_param_gather); validate_args
        # asserts it comes with the distributed optimizer and --overlap-grad-reduce
        a += ["--use-distributed-optimizer", "--overlap-param-gather"]
        if p.dp_shard is not None:  # HSDP: optimizer copies, each sharded over dp_shard x cp
            a.append(f"--num-distributed-optimizer-instances {p.replicate_degree}")
    if plan.offload.optimizer:  # validate_args: "The optimizer cpu offload must be used in
        # conjunction with `--use-precision-aware-optimizer`" (the hybrid device optimizer)
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0",
              "--use-precision-aware-optimizer"]
    if rc.policy == RecomputePolicy.SELECTIVE:
        a.append("--recompute-granularity selective")
        if rc.modules:  # Megatron-Core's names (TransformerConfig.recompute_modules)
            a.append("--recompute-modules " + " ".join(m.value for m in rc.modules))
    elif rc.policy == RecomputePolicy.FULL:
        a.append("--recompute-granularity full")
        if rc.method == RecomputeMethod.UNIFORM:  # groups of num_layers, one input each
            a += ["--recompute-method uniform", f"--recompute-num-layers {rc.num_layers}"]
        elif rc.num_layers is None:  # every layer: uniform groups of one layer
            a += ["--recompute-method uniform", "--recompute-num-layers 1"]
        else:
            a += ["--recompute-method block", f"--recompute-num-layers {rc.num_layers}"]
    a += [
        f"--micro-batch-size {plan.batch.micro_batch_size}",
        f"--global-batch-size {plan.batch.global_batch_size}",
    ]
    a += te_args(plan)  # precision, attention backend, CP exchange
    a += _model_args(model)
    return a + moe_args(plan, model)  # experts and latent attention (none for dense models)


def _model_args(m: ModelSpec) -> list[str]:
    a = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn}",
        f"--num-attention-heads {m.num_heads}",
    ]
    if m.kv_heads != m.num_heads:
        a += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.q_width != m.hidden_size and m.mla is None:  # Megatron's default: h / heads; MLA
        # states its head widths with its own flags (megatron_moe.moe_args)
        a.append(f"--kv-channels {m.head_dim}")
    a += [f"--seq-length {m.seq_len}", f"--max-position-embeddings {m.seq_len}"]
    a += [f"--attention-dropout {m.dropout}", f"--hidden-dropout {m.dropout}"]
    if m.mlp == MlpKind.SWIGLU:
        a.append("--swiglu")
    a.append("--normalization " + ("RMSNorm" if m.norm == NormKind.RMSNORM else "LayerNorm"))
    a += norm_args(m)  # --norm-epsilon, and --qk-layernorm for QK-norm or MLA's latent norms
    a.append(
        "--position-embedding-type "
        + ("rope" if m.position == PositionKind.ROPE else "learned_absolute")
    )
    if m.position == PositionKind.ROPE:  # the base, whatever Megatron's default (10000)
        a.append(f"--rotary-base {int(m.rope_theta)}")
    if m.rope_scaling is not None and m.rope_scaling.rope_type == LLAMA3_ROPE_TYPE:
        # Llama 3.1's, in Megatron-Core's fixed band
        a += ["--use-rope-scaling", f"--rope-scaling-factor {m.rope_scaling.factor!r}"]
    a += yarn_args(m)  # YaRN: MLA's --rope-type yarn and its flags (megatron_moe)
    if not m.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not m.bias:  # linear_qkv is built with bias=add_bias_linear or add_qkv_bias
        a.append("--disable-bias-linear")
        if m.qkv_bias:
            a.append("--add-qkv-bias")
    a += ["--tokenizer-type NullTokenizer", f"--vocab-size {m.vocab_size - NULL_TOKENIZER_EXTRA}"]
    return a


def _environment(plan: Plan) -> list[str]:
    """CUDA_DEVICE_MAX_CONNECTIONS as validate_args wants it: Megatron-FSDP asserts it is not 1
    (its user guide: unset it); tensor or context parallelism asserts it is 1 before Blackwell
    (get_device_arch_version() < 10; harmless from Blackwell on)."""
    if plan.zero_stage >= 2:
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS"]
    if plan.parallel.tp > 1 or plan.parallel.cp > 1:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    return []


class MegatronTarget(ExportTarget):
    name = "megatron"
    summary = "Megatron-LM pretrain_gpt.py arguments (TP/PP/VPP/CP/SP, recompute, dist-opt, model)"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        check_job_name(opts.job_name)  # written unquoted as --rdzv-id
        if opts.out is not None:  # named in the script's run instructions, a comment line
            check_path_word("--out", opts.out)
        return (layout_reasons(plan, opts.gpus_per_node) + _reasons(plan, model)
                + cuda_only_reasons(plan, CUDA_ONLY))

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        flags = [shell_join(f.split(" ")) for f in megatron_args(plan, model)]
        torchrun = [f"--nnodes={lay.num_nodes}", f"--nproc-per-node={lay.nproc_per_node}"]
        if opts.max_restarts is not None:  # torchrun restarts the worker group (its default 0)
            torchrun.append(f"--max-restarts={opts.max_restarts}")
        if lay.num_nodes > 1:
            torchrun += [
                "--rdzv-backend=c10d",
                f'"--rdzv-endpoint=${{RDZV_HOST}}:{opts.rdzv_port}"',
                f"--rdzv-id={opts.job_name}",
            ]
        text = "\n".join(
            [
                "#!/usr/bin/env bash",
                f"# Megatron-LM arguments for model {model.name}, written by "
                "`autoplan export --to megatron`.",
                "# NullTokenizer adds one EOD token to --vocab-size, so the model has the plan's "
                f"vocabulary ({model.vocab_size}).",
                *length_lines(plan, model, "Megatron-LM"),
                "# Append it, data and optimizer flags as arguments to this script; a real "
                "tokenizer's flags replace",
                "# NullTokenizer (its vocabulary then decides the model's, not --vocab-size):",
                f"# bash {shlex.quote(opts.out) if opts.out else 'megatron_args.sh'} "
                "--train-iters N --data-path ... [--tokenizer-type ... --tokenizer-model ...] "
                "(run from the "
                "Megatron-LM checkout"
                + (" on every node, RDZV_HOST set to the first node)" if lay.num_nodes > 1
                   else ")"),
                "set -euo pipefail",
                *_environment(plan),
                "MEGATRON_ARGS=(",
                *(f"  {f}" for f in flags),
                ")",
                continued(
                    [
                        "torchrun",
                        *torchrun,
                        shlex.quote(opts.script or "pretrain_gpt.py"),
                        '"${MEGATRON_ARGS[@]}"',
                        '"$@"',
                    ]
                ),
                "",
            ]
        )
        return {"megatron_args.sh": text}
