"""`--to deepspeed`: a DeepSpeed JSON config plus the `deepspeed` launch command.

Plans with tensor or pipeline parallelism launch Megatron-DeepSpeed's pretrain_gpt.py (DeepSpeed's
3D parallelism: Megatron TP/SP, DeepSpeed's pipeline engine, ZeRO; megatron_deepspeed.py); the
rest launch the user's train.py with plain DeepSpeed (ZeRO, offload). train_batch_size =
train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp, as DeepSpeed asserts. The
launch names the JSON by its file name in the launch's own folder, where export writes both.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.cost.rows import bf16_optimizer_accumulation
from autoplan.export import megatron_deepspeed
from autoplan.export.base import (
    ExportOptions,
    ExportTarget,
    grad_accum_steps,
    layout,
    layout_reasons,
)
from autoplan.export.launch import (
    check_path_word,
    comment,
    continued,
    cuda_only_reasons,
    shell_join,
)
from autoplan.export.megatron import length_lines
from autoplan.export.megatron_moe import megatron_hint
from autoplan.model_spec import ModelSpec, PositionKind
from autoplan.plan import Plan, Precision, RecomputePolicy

CONFIG_NAME = "ds_config.json"
SCRIPT_DIR = 'script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"'
"""The launch's own folder, where the DeepSpeed config is written beside it: the launch runs
from the Megatron-DeepSpeed checkout or the user's training folder, and DeepSpeed's multi-node
launcher hands the path to every node, so the launch names the config by an absolute path."""
HOSTFILE = "hostfile"
HOSTFILE_WORD = f'--hostfile="$script_dir"/{HOSTFILE}'
"""On several nodes DeepSpeed's launcher reads the nodes from a hostfile, found beside the
launch as its config is (SCRIPT_DIR), not in whatever folder it runs from: without one it
warns and trains on the local node alone (deepspeed/launcher/runner.py fetch_hostfile)."""


def hostfile_lines(num_nodes: int, slots: int) -> list[str]:
    """The header's word on the hostfile a launch on several nodes reads."""
    if num_nodes == 1:
        return []
    return comment(f"{num_nodes} nodes: DeepSpeed reads them from {HOSTFILE} in this script's "
                   f"folder, one line per node ('<host> slots={slots}'); the launch stops "
                   "without it (DeepSpeed would train on this node alone).")


def hostfile_check(slots: int) -> list[str]:
    """Script lines that stop the launch (exit 2) where the hostfile is missing."""
    why = (f"no {HOSTFILE} beside this launch: write one line per node ('<host> slots={slots}') "
           "to")
    return [f'[ -f "$script_dir"/{HOSTFILE} ] || {{ echo {shlex.quote(why)} '
            f'"$script_dir/{HOSTFILE}" >&2; exit 2; }}']


CUDA_ONLY_3D = ("Megatron-DeepSpeed trains on CUDA GPUs only (NCCL, Megatron's fused CUDA "
                "kernels)")
CUDA_ONLY = ("DeepSpeed runs on a CPU host only through its CPU accelerator (DS_ACCELERATOR=cpu, "
             "ranks bound to cores), which this export's GPU launch (deepspeed --num_gpus) does "
             "not set up")


def _reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What plain DeepSpeed (tp = pp = 1: ZeRO data parallelism) cannot express of a plan the
    plan rules accept (they refuse sequence parallelism at tp = 1, vpp without a pipeline and
    offload at the wrong ZeRO stage for every target)."""
    p, why = plan.parallel, []
    if model.moe is not None or model.mla is not None:
        why.append(
            f"model {model.name} has experts or latent attention: DeepSpeed-MoE is model code "
            "(deepspeed.moe.layer.MoE with its own ep_size) that ds_config.json cannot state; "
            + megatron_hint(model)
        )
    if model.mtp_layers:
        why.append(f"model.mtp_layers={model.mtp_layers}: DeepSpeed has no multi-token-"
                   "prediction module; " + megatron_hint(model, "--mtp-num-layers"))
    if p.cp > 1:
        why.append(
            f"cp={p.cp}: DeepSpeed's sequence parallelism (Ulysses) is an all-to-all head split, "
            "not the ring context parallelism the plan was costed for"
        )
    rc = plan.recompute
    if rc.policy == RecomputePolicy.SELECTIVE:
        why.append(
            "recompute selective: DeepSpeed checkpoints whole blocks; attention-only "
            "recompute is not a config setting (Megatron-DeepSpeed's needs tp > 1 or pp > 1)"
        )
    if rc.policy == RecomputePolicy.FULL and rc.num_layers is not None:
        why.append(
            f"recompute.method={rc.method.value} num_layers={rc.num_layers}: DeepSpeed's "
            "activation_checkpointing config has no layer count or group size (the model's "
            "code chooses what deepspeed.checkpointing wraps); export to megatron-deepspeed "
            "(--checkpoint-num-layers) or megatron"
        )
    return why


def hsdp_reasons(plan: Plan) -> list[str]:
    """DeepSpeed has no HSDP: MiCS (zero_optimization.mics_shard_size, ZeRO-3 sharded in
    groups and replicated across them) was removed (deepspeed 0.19.8's runtime/config.py
    rejects the key), and ZeRO++'s hpZ (zero_hpz_partition_size) keeps only a secondary copy
    of the weights inside a group while gradients and optimizer states stay sharded over all
    of dp: other memory and traffic than the plan was costed for."""
    if plan.parallel.dp_shard is None:
        return []
    return [f"parallel.dp_shard={plan.parallel.dp_shard}: DeepSpeed has no HSDP (MiCS is "
            "removed; ZeRO++ hpZ shards only a second copy of the weights in the group); "
            "set dp_shard: null"]


def fp8_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """DeepSpeed's config has no fp8 training (deepspeed 0.19.8 runtime/config.py reads bf16 and
    fp16 sections only; FP8 GEMMs are model code, Transformer Engine layers), and neither has
    the Megatron-DeepSpeed launch this export writes (--bf16 or --fp16)."""
    if plan.precision != Precision.FP8:
        return []
    return ["precision fp8: DeepSpeed's config and the Megatron-DeepSpeed launch this export "
            "writes have no fp8 training (bf16 and fp16 only); use bf16, or "
            + megatron_hint(model)]


def bf16_optimizer(plan: Plan) -> bool:
    """Whether the config asks for DeepSpeed's BF16_Optimizer with fp32 gradient accumulation
    (data_types.grad_accum_dtype fp32): where cost/rows.bf16_optimizer_accumulation, the rule
    the deepspeed runtime is priced by, says so. ZeRO-0 pipelines take BF16_Optimizer with no
    setting (and refuse fp32 accumulation: "unsupported mix")."""
    if plan.precision != Precision.BF16:
        return False
    fp32, _ = bf16_optimizer_accumulation(
        np.asarray(plan.parallel.pp), np.asarray(plan.zero_stage),
        np.asarray(plan.grad_reduce_dtype is None), np.asarray(plan.offload.optimizer))
    return bool(fp32)


def ds_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed config dict for a plan that `check` accepted."""
    gas = grad_accum_steps(plan)
    assert gas is not None
    cfg: dict[str, Any] = {
        "train_batch_size": plan.batch.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.batch.micro_batch_size,
        "gradient_accumulation_steps": gas,
    }
    zero: dict[str, Any] = {"stage": plan.zero_stage}
    if plan.offload.optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload.params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg["zero_optimization"] = zero
    if plan.grad_reduce_dtype is not None:  # the dtype of DeepSpeed's gradient averaging
        cfg["communication_data_type"] = plan.grad_reduce_dtype.value
    if plan.precision == Precision.BF16:
        cfg["bf16"] = {"enabled": True}
    elif plan.precision == Precision.FP16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if bf16_optimizer(plan):  # runtime/constants.py DATA_TYPES, GRAD_ACCUM_DTYPE
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if plan.recompute.policy == RecomputePolicy.FULL:
        cfg["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return cfg  # Megatron-DeepSpeed builds tp and the pipeline from its launch flags


class DeepSpeedTarget(ExportTarget):
    name = "deepspeed"
    summary = ("DeepSpeed JSON config + launch: Megatron-DeepSpeed 3D (tp/pp/sp, pipeline "
               "engine, ZeRO) or plain ZeRO/offload")

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        three_d = megatron_deepspeed.runs_3d(plan)
        own = megatron_deepspeed.reasons(plan, model) if three_d else _reasons(plan, model)
        return layout_reasons(plan, opts.gpus_per_node) + own + hsdp_reasons(plan) \
            + fp8_reasons(plan, model) + cuda_only_reasons(plan, CUDA_ONLY_3D if three_d else CUDA_ONLY)

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        config = Path(opts.out).name if opts.out else CONFIG_NAME  # the --out name (#16 item 7)
        check_path_word("--out", opts.out or config)
        config_word = '"$script_dir"/' + shlex.quote(config)  # beside this script
        lay = layout(plan, opts.gpus_per_node)
        argv = ["deepspeed", f"--num_nodes={lay.num_nodes}", f"--num_gpus={lay.nproc_per_node}"]
        hostfile = [HOSTFILE_WORD] if lay.num_nodes > 1 else []  # beside this script too
        if megatron_deepspeed.runs_3d(plan):
            head = [
                "# Megatron-DeepSpeed (DeepSpeed's 3D parallelism), written by `autoplan export "
                "--to deepspeed`:",
                f"# run from the Megatron-DeepSpeed checkout; the DeepSpeed config is {config}, "
                "read from this script's folder.",
                *length_lines(plan, model, "Megatron-DeepSpeed"),
                "# Append it, data, tokenizer and optimizer flags as arguments to this script.",
                *megatron_deepspeed.rope_note(model),
            ]
            flags = megatron_deepspeed.launch_args(plan, model)
            env = ["export CUDA_DEVICE_MAX_CONNECTIONS=1"] if plan.sequence_parallel else []
            script = shlex.quote(opts.script or megatron_deepspeed.SCRIPT)
            body = continued([*argv, *hostfile, script,
                              *(shell_join(f.split(" ", 1)) for f in flags),
                              f"--deepspeed_config {config_word}", '"$@"'])
        else:
            head = ["# Written by `autoplan export --to deepspeed`. The model is code, not config:",
                    *model_comment(plan, model),
                    f"# The DeepSpeed config is {config}, read from this script's folder."]
            env = []
            body = " ".join([shell_join(argv), *hostfile,
                             shell_join([opts.script or "train.py", "--deepspeed"])]) \
                + f" --deepspeed_config={config_word}" + ' "$@"'
        head += hostfile_lines(lay.num_nodes, lay.nproc_per_node)
        launch = "\n".join(["#!/usr/bin/env bash", *head, "set -euo pipefail", SCRIPT_DIR,
                            *(hostfile_check(lay.nproc_per_node) if hostfile else []), *env,
                            body, ""])
        text = json.dumps(ds_config(plan), indent=2) + "\n"
        return {CONFIG_NAME: text, "launch.sh": launch}


def _theta(m: ModelSpec) -> str:
    if m.position != PositionKind.ROPE:
        return ""
    return f" (theta {m.rope_theta:g}{megatron_deepspeed.rope_scaling_words(m)})"


def _qk_norm(m: ModelSpec) -> str:
    return " (q and k RMS-normalised per head before RoPE: qk_norm)" if m.qk_norm else ""


def model_comment(plan: Plan, model: ModelSpec) -> list[str]:
    """What the training script must build: the plan's fields DeepSpeed's config cannot hold."""
    m = model
    last = f"# dropout {m.dropout}, {plan.attention.value} attention"
    if plan.parallel.pp > 1:
        last += f", as a PipelineModule with num_stages={plan.parallel.pp}"
    if plan.recompute.policy == RecomputePolicy.FULL:
        last += ", each block under deepspeed.checkpointing.checkpoint"
    return [
        f"# the script builds model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_heads} heads ({m.kv_heads} kv), ffn {m.ffn} ({m.mlp.value}),",
        f"# {m.norm.value} at eps {m.norm_eps:g}{_qk_norm(m)}, {m.position.value} "
        f"positions{_theta(m)}, bias "
        f"{'q, k and v only' if m.qkv_bias else str(m.bias).lower()}, tied embeddings "
        f"{str(m.tie_embeddings).lower()}, vocab {m.vocab_size}, seq_len {m.seq_len},",
        last + ".",
    ]
