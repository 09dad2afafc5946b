"""What every export target shares: its options, its tiny ABC and the refuse-or-render entry point.

A target either expresses every field of a plan in its consumer's own format or refuses with the
reasons; `export_plan` first judges the plan by autoplan's plan rules (every target's), then
turns all refusals into one ConfigError so the CLI writes nothing.
"""

from __future__ import annotations

import abc
import shlex
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
            else refusal_fix(target, plan, model, opts, runtime),
        )
    return target.render(plan, model, opts)


def refusal_fix(target: ExportTarget, plan: Plan, model: ModelSpec, opts: ExportOptions,
                runtime: str | None) -> str:
    """How to get a plan `target` expresses: a search with `--runtime runtime`, where the plan
    breaks that runtime's rules (cost/runtime_rules.py, which `search --runtime` keeps to)
    and some plan of the model on these GPUs is expressible (a search may find it); and the
    fewest plan edits that make this one expressible (plan_edits), as `--set` writes them."""
    edits = plan_edits(target, plan, model, opts)
    fixes = []
    if runtime is not None and _runtime_refuses(plan, model, runtime) and (
            edits or _some_plan_expressible(target, plan, model, opts)):
        fixes.append(f"search again with --runtime {runtime} (its plans keep to what "
                     f"{target.name} runs)")
    if edits:
        priced = f" --runtime {runtime}" if runtime is not None else ""
        fixes.append(f"set {', '.join(edits)} in the plan (`autoplan estimate --plan "
                     f"{shlex.quote(opts.plan_path)}{priced} --set {' '.join(edits)}` prices "
                     "it)")
    return " or ".join(fixes) if fixes else "change the plan or pick another target"


def _runtime_refuses(plan: Plan, model: ModelSpec, runtime: str) -> bool:
    from autoplan.cost.runtime_rules import refusals
    from autoplan.cost.runtimes import load_runtime
    from autoplan.export.launch import on_cpu

    try:
        return bool(refusals(plan, load_runtime(runtime, on_cpu=on_cpu(plan)), model))
    except ConfigError:  # a traits file that does not load here: no hint, the refusal stands
        return False


def _accepts(target: ExportTarget, plan: Plan, model: ModelSpec, opts: ExportOptions) -> bool:
    """Whether the plan rules and `target` accept `plan` (an option the target refuses,
    whatever the plan, is no acceptance)."""
    try:
        return not plan_reasons(plan, model) and not target.check(plan, model, opts)
    except ConfigError:
        return False


def _some_plan_expressible(target: ExportTarget, plan: Plan, model: ModelSpec,
                           opts: ExportOptions) -> bool:
    """Whether `target` expresses a plain plan of the model on the plan's GPUs (data parallel
    alone, at some ZeRO stage and precision): if none, what it refuses is the model or the
    GPU count (an architecture it cannot build, GPUs short of whole nodes), which no search
    with its runtime changes."""
    from autoplan.plan import Attention, Offload, Parallel, Pipeline, Precision, Recompute

    precisions = dict.fromkeys((plan.precision, Precision.BF16, Precision.FP32))
    attentions = dict.fromkeys((plan.attention, Attention.FLASH))
    base = plan.replace(parallel=Parallel(dp=plan.world_size), sequence_parallel=False,
                        pipeline=Pipeline(), recompute=Recompute(), offload=Offload(),
                        grad_reduce_dtype=None, predicted=None)
    return any(_accepts(target, base.replace(zero_stage=zero, precision=precision,
                                             attention=attention), model, opts)
               for zero in (3, 2, 1, 0) for precision in precisions for attention in attentions)


def _edit_choices(plan: Plan) -> list[str]:
    """Single-field `--set` edits that may lift a target's refusal, nearest first: the knobs
    runtimes differ in (cost/runtime_rules.py), never the degrees, batch or model."""
    zero = plan.zero_stage
    stages = sorted((s for s in range(4) if s != zero), key=lambda s: (abs(s - zero), -s))
    choices = [f"zero_stage={s}" for s in stages]
    choices.append(f"sequence_parallel={str(not plan.sequence_parallel).lower()}")
    if plan.recompute.num_layers is not None:
        choices.append("recompute.num_layers=null")
    choices += [f"recompute.policy={p}" for p in ("full", "none", "selective")
                if p != plan.recompute.policy.value]
    choices += [f"attention={a}" for a in ("flash", "eager") if a != plan.attention.value]
    choices += [f"precision={p}" for p in ("bf16", "fp32") if p != plan.precision.value]
    if plan.parallel.pp > 1:
        choices += [f"pipeline.schedule={s}" for s in ("1f1b", "interleaved-1f1b")
                    if s != plan.pipeline.schedule.value]
        choices += [f"pipeline.vpp={v}" for v in (1, 2) if v != plan.pipeline.vpp]
    choices += [f"offload.{k}=false" for k in ("optimizer", "params")
                if getattr(plan.offload, k)]
    if plan.grad_reduce_dtype is not None:
        choices.append("grad_reduce_dtype=null")
    return choices


def plan_edits(target: ExportTarget, plan: Plan, model: ModelSpec,
               opts: ExportOptions) -> list[str]:
    """The fewest `--set` edits after which the plan rules and `target` accept the plan: one
    of _edit_choices, else two of those that each lift some refusal (or reword it); empty when none do (a
    model the target cannot build, a layout it cannot split)."""
    try:
        before = set(plan_reasons(plan, model) + target.check(plan, model, opts))
    except ConfigError:  # an option the target refuses whatever the plan: no edit helps
        return []
    helpful = []
    for choice in _edit_choices(plan):
        edited = _edited(plan, [choice])
        if edited is None:
            continue
        after = set(plan_reasons(edited, model) + target.check(edited, model, opts))
        if not after:
            return [choice]
        if before - after:
            helpful.append(choice)
    for i, first in enumerate(helpful):
        for second in helpful[i + 1:]:
            if first.split("=")[0] == second.split("=")[0]:
                continue
            edited = _edited(plan, [first, second])
            if edited is not None and _accepts(target, edited, model, opts):
                return [first, second]
    return []


def _edited(plan: Plan, edits: list[str]) -> Plan | None:
    """`plan` with `--set` edits applied as estimate applies them; None where they do not
    make a plan."""
    from autoplan.plan import plan_from_dict, plan_to_dict
    from autoplan.plan_args import apply_sets

    data = plan_to_dict(plan)
    data.pop("predicted", None)
    try:
        apply_sets(data, edits)
        return plan_from_dict(data).replace(model=plan.model)
    except ConfigError:
        return None


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
