"""What every export target shares: its options, its tiny ABC and the refuse-or-render entry point.

A target either expresses every field of a plan in its consumer's own format or refuses with the
reasons; `export_plan` first judges the plan by autoplan's plan rules (every target's), then
turns all refusals into one ConfigError so the CLI writes nothing.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan


@dataclass(frozen=True)
class ExportOptions:
    """Everything an export needs that the plan leaves to the site where the job runs."""

    plan_path: str = "plan.yaml"
    """Path of the plan file as the launched job sees it."""
    gpus_per_node: int = 8
    """GPUs on one node (from the hardware profile, or --gpus-per-node)."""
    checkpoint_dir: str = "checkpoints"
    """Where the job writes and resumes checkpoints."""
    max_restarts: int | None = None
    """torchrun --max-restarts: worker-group restarts before the job fails. None: the launcher
    exports' default (launch.RESTARTS); megatron writes none (torchrun's 0)."""
    job_name: str = "autoplan"
    """Scheduler job name (SLURM job, Kubernetes object name)."""
    rdzv_port: int = 29500
    """TCP port of the c10d rendezvous on the first node."""
    image: str = "autoplan:latest"
    """Container image (Kubernetes)."""
    namespace: str | None = None
    """Kubernetes namespace; None leaves it to kubectl's context."""
    k8s_kind: str = "trainjob"
    """trainjob (Kubeflow Trainer v2) | pytorchjob (Kubeflow training-operator v1) | jobset."""
    torchtitan_format: str = "python"
    """python (config_registry function, torchtitan >= 0.3) | toml (torchtitan <= 0.2.2)."""
    script: str | None = None
    """Training script for the deepspeed/megatron launch command (default per target)."""
    out: str | None = None
    """Where the primary file is written (--out); run instructions name it. None: stdout."""
    elastic: bool = False
    """torchrun --nnodes=MIN:MAX running `autoplan train --elastic` (slurm, kubernetes)."""
    min_nodes: int = 1
    """With elastic: the fewest nodes the job keeps training on (re-planned for their GPUs)."""


@dataclass(frozen=True)
class Layout:
    """How the plan's GPUs fall on nodes."""

    num_nodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.nproc_per_node


def layout_reasons(plan: Plan, gpus_per_node: int) -> list[str]:
    """Why the plan's GPUs cannot be laid out on whole nodes (empty when they can). That the
    degrees multiply to cluster.num_gpus is a plan rule (plan_reasons), said there once."""
    world = plan.world_size
    reasons = []
    if gpus_per_node < 1:
        reasons.append(f"gpus_per_node = {gpus_per_node} must be at least 1")
    elif world > gpus_per_node and world % gpus_per_node:
        reasons.append(
            f"{world} GPUs do not fill whole nodes of {gpus_per_node} GPUs; "
            "pick a multiple of gpus_per_node"
        )
    return reasons


def layout(plan: Plan, gpus_per_node: int) -> Layout:
    world = plan.world_size
    if world <= gpus_per_node:
        return Layout(num_nodes=1, nproc_per_node=world)
    return Layout(num_nodes=world // gpus_per_node, nproc_per_node=gpus_per_node)


class ExportTarget(abc.ABC):
    """One consumer format. Subclasses set `name`/`summary` and implement check and render."""

    name: ClassVar[str]
    """The value of `--to`."""
    summary: ClassVar[str]
    """One line for --help."""

    @abc.abstractmethod
    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        """Reasons this target cannot express the plan; empty when it can."""

    @abc.abstractmethod
    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        """Files by name, the primary one first; only called when the plan rules and `check`
        found nothing (export_plan), so the plan's degrees, batch and layer split are whole."""


def plan_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """Every plan rule the plan breaks (autoplan.plan_rules.validate_plan: the rule set search,
    estimate and `autoplan train` judge by), for any target. A profile this machine cannot
    load (another site's) leaves out the rules that need the device."""
    from autoplan.hardware import cluster
    from autoplan.plan_rules import validate_plan

    try:
        spec = cluster(plan.cluster.profile, plan.cluster.num_gpus)
    except ConfigError:
        spec = None
    return validate_plan(plan, model, spec)


def export_plan(
    target: ExportTarget, plan: Plan, model: ModelSpec, opts: ExportOptions,
    runtime: str | None = None,
) -> dict[str, str]:
    """Render `plan` for `target`, or raise ConfigError listing every reason it cannot, each
    once: the plan rules it breaks (exit 2, a mistake in the plan), then the target's own
    refusals (which leave what the plan rules judge to them: world size, batch, layer split),
    with the fix that gets an expressible plan (refusal_fix; `runtime`: the `search --runtime`
    name of the engine the target runs, whose rules a search then keeps to)."""
    rules = plan_reasons(plan, model)
    reasons = list(dict.fromkeys(rules + target.check(plan, model, opts)))
    if reasons:
        raise ConfigError(
            f"--to {target.name}",
            "cannot express this plan: " + "; ".join(reasons),
            "fix the plan (autoplan's plan rules refuse it for every target)" if rules
            else _refusal_fix(target, plan, model, opts, runtime),
        )
    return target.render(plan, model, opts)


def _refusal_fix(target: ExportTarget, plan: Plan, model: ModelSpec, opts: ExportOptions,
                 runtime: str | None) -> str:
    from autoplan.export.refusal_fix import refusal_fix  # it judges plans by this module's rules

    return refusal_fix(target, plan, model, opts, runtime)


def even_split(total: int, parts: int) -> bool:
    return parts > 0 and total % parts == 0


def stage_layers(plan: Plan, model: ModelSpec) -> tuple[int, ...] | None:
    """Layers of each of the pp*vpp stages, in model order; None when they cannot be split."""
    stages = plan.parallel.pp * plan.pipeline.vpp
    if plan.pipeline.layers_per_stage is not None:
        split = tuple(plan.pipeline.layers_per_stage)
        if len(split) != stages or sum(split) != model.num_layers:
            return None
        return split
    if not even_split(model.num_layers, stages):
        return None
    return (model.num_layers // stages,) * stages


def grad_accum_steps(plan: Plan) -> int | None:
    """Micro-batches per step per replica, or None when the batch does not divide."""
    per_step = plan.batch.micro_batch_size * plan.parallel.dp
    if plan.batch.global_batch_size % per_step:
        return None
    return plan.batch.global_batch_size // per_step
