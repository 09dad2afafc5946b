"""`--to deepspeed`: a DeepSpeed JSON config plus the `deepspeed` launch command.

train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp, as DeepSpeed
asserts. DeepSpeed configures ZeRO, offload, precision, activation checkpointing, AutoTP and its
pipeline engine from this file; the model code still builds the PipelineModule and calls
deepspeed.checkpointing, which is where the launch command's script comes in.
"""

from __future__ import annotations

import json
from typing import Any

from autoplan.export.base import (
    ExportOptions,
    ExportTarget,
    batch_reasons,
    grad_accum_steps,
    layout,
    layout_reasons,
    stage_layers,
    stage_reasons,
)
from autoplan.export.launch import shell_join
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, Precision, RecomputePolicy, Schedule

CONFIG_NAME = "ds_config.json"


def _reasons(plan: Plan, model: ModelSpec) -> list[str]:
    p, why = plan.parallel, []
    if model.moe is not None or model.mla is not None:
        why.append(
            f"model {model.name} has experts or latent attention: DeepSpeed-MoE is model code "
            "(deepspeed.moe.layer.MoE with its own ep_size) that ds_config.json cannot state; "
            "export to megatron"
        )
    if p.cp > 1:
        why.append(
            f"cp={p.cp}: DeepSpeed's sequence parallelism (Ulysses) is an all-to-all head split, "
            "not the ring context parallelism the plan was costed for"
        )
    if plan.sequence_parallel:
        why.append(
            "sequence_parallel: Megatron-style sequence parallelism is model code, "
            "not a DeepSpeed config setting"
        )
    if p.pp > 1:
        if plan.zero_stage >= 2:
            why.append(
                f"zero_stage={plan.zero_stage} with pp={p.pp}: DeepSpeed's pipeline engine "
                "supports ZeRO stage 0 or 1 only"
            )
        if plan.pipeline.schedule != Schedule.ONE_F_ONE_B or plan.pipeline.vpp > 1:
            why.append(
                f"schedule {plan.pipeline.schedule.value} vpp={plan.pipeline.vpp}: "
                "DeepSpeed's pipeline engine runs only its own non-interleaved 1F1B schedule"
            )
        split = stage_layers(plan, model)
        if split is not None and len(set(split)) > 1:
            why.append(
                f"uneven layers_per_stage {list(split)}: DeepSpeed partitions "
                "uniformly from the config; a custom split lives in PipelineModule code"
            )
        why += stage_reasons(plan, model)
    if p.tp > 1 and (plan.zero_stage == 3 or p.pp > 1):
        why.append(
            f"tp={p.tp} with zero_stage={plan.zero_stage} pp={p.pp}: DeepSpeed AutoTP "
            "training combines with ZeRO 0-2 and no pipeline only"
        )
    rc = plan.recompute
    if rc.policy == RecomputePolicy.SELECTIVE:
        why.append(
            "recompute selective: DeepSpeed checkpoints whole blocks; attention-only "
            "recompute is not a config setting"
        )
    if rc.policy == RecomputePolicy.FULL and rc.num_layers is not None:
        why.append(
            f"recompute.num_layers={rc.num_layers}: DeepSpeed's config cannot limit "
            "recompute to some layers per stage"
        )
    if plan.offload.optimizer and plan.zero_stage == 0:
        why.append("offload.optimizer needs zero_stage >= 1 in DeepSpeed")
    if plan.offload.params and plan.zero_stage != 3:
        why.append("offload.params needs zero_stage 3 in DeepSpeed")
    return why


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
    if plan.precision == Precision.BF16:
        cfg["bf16"] = {"enabled": True}
    elif plan.precision == Precision.FP16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if plan.recompute.policy == RecomputePolicy.FULL:
        cfg["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    if plan.parallel.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.parallel.tp}
    if plan.parallel.pp > 1:
        full = plan.recompute.policy == RecomputePolicy.FULL
        cfg["pipeline"] = {
            "stages": plan.parallel.pp,
            "partition": "uniform",
            "activation_checkpoint_interval": 1 if full else 0,
        }
    return cfg


class DeepSpeedTarget(ExportTarget):
    name = "deepspeed"
    summary = "DeepSpeed JSON config (ZeRO, offload, precision, checkpointing) + launch command"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        return (
            layout_reasons(plan, opts.gpus_per_node) + batch_reasons(plan) + _reasons(plan, model)
        )

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        argv = ["deepspeed", f"--num_nodes={lay.num_nodes}", f"--num_gpus={lay.nproc_per_node}"]
        if lay.num_nodes > 1:
            argv.append("--hostfile=hostfile")
        argv += [opts.script or "train.py", "--deepspeed", f"--deepspeed_config={CONFIG_NAME}"]
        launch = "\n".join(
            [
                "#!/usr/bin/env bash",
                "# Written by `autoplan export --to deepspeed`. The model is code, not config:",
                *model_comment(plan, model),
                "set -euo pipefail",
                shell_join(argv) + ' "$@"',
                "",
            ]
        )
        text = json.dumps(ds_config(plan), indent=2) + "\n"
        return {CONFIG_NAME: text, "launch.sh": launch}


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
        f"# {m.norm.value}, {m.position.value} positions, bias {str(m.bias).lower()}, tied "
        f"embeddings {str(m.tie_embeddings).lower()}, vocab {m.vocab_size}, seq_len {m.seq_len},",
        last + ".",
    ]
