"""The fix an export refusal suggests: a search with the target's `--runtime`, and the fewest
`--set` edits after which the plan rules, the target and the memory check accept the plan
(base.export_plan raises the refusal; pricing.check_fits is the memory check it must pass)."""

from __future__ import annotations

import shlex

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, ExportTarget, plan_reasons
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan


def refusal_fix(target: ExportTarget, plan: Plan, model: ModelSpec, opts: ExportOptions,
                runtime: str | None) -> str:
    """How to get a plan `target` expresses: a search with `--runtime runtime`, where the plan
    breaks that runtime's rules (cost/runtime_rules.py, which `search --runtime` keeps to)
    and some plan of the model on these GPUs is expressible (a search may find it); and the
    fewest plan edits that make this one expressible (plan_edits), as `--set` writes them."""
    edits = plan_edits(target, plan, model, opts, runtime)
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


def _fits(plan: Plan, model: ModelSpec, opts: ExportOptions, runtime: str | None) -> bool:
    """Whether `plan` passes the memory check run_export makes next (pricing.check_fits): it
    fits as `runtime` (the target's engine; "autoplan" or None, autoplan's own) holds it, on
    nodes of the GPUs written. A profile that does not load here is not checked, so fits."""
    from autoplan.cost.estimate import memory_misses
    from autoplan.export.nodes import written_cluster

    try:
        cluster = written_cluster(plan, opts.gpus_per_node)
    except ConfigError:
        return True
    engine = None if runtime == "autoplan" else runtime
    return not memory_misses(plan, cluster, model, engine)[1]


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


def plan_edits(target: ExportTarget, plan: Plan, model: ModelSpec, opts: ExportOptions,
               runtime: str | None = None) -> list[str]:
    """The fewest `--set` edits after which the plan rules and `target` accept the plan and it
    fits in memory as `runtime` (the target's engine) holds it, as the export then checks: one
    of _edit_choices, else two of those that each lift some refusal (or reword it); empty when
    none do (a model the target cannot build, a layout it cannot split, no edit that fits)."""
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
        if not after and _fits(edited, model, opts, runtime):
            return [choice]
        if before - after:
            helpful.append(choice)
    for i, first in enumerate(helpful):
        for second in helpful[i + 1:]:
            if first.split("=")[0] == second.split("=")[0]:
                continue
            edited = _edited(plan, [first, second])
            if (edited is not None and _accepts(target, edited, model, opts)
                    and _fits(edited, model, opts, runtime)):
                return [first, second]
    return []


def _edited(plan: Plan, edits: list[str]) -> Plan | None:
    """`plan` with `--set` edits applied as estimate applies them; None where they do not
    make a plan."""
    from autoplan.plan import plan_from_dict
    from autoplan.plan_files import plan_to_dict
    from autoplan.plan_sets import apply_sets

    data = plan_to_dict(plan)
    data.pop("predicted", None)
    try:
        apply_sets(data, edits)
        return plan_from_dict(data).replace(model=plan.model)
    except ConfigError:
        return None
