"""What the runtime needs of a plan, checked before any process trains.

There is one rule set, `autoplan.plan_rules` (the planner's): the runtime judges a plan by it
and adds only what depends on the launch (the process count). Every problem is listed once, in
the rule's own words, in one ConfigError (exit 2).
"""

from __future__ import annotations

import logging
from pathlib import Path

from autoplan import resources
from autoplan.errors import AutoplanError, ConfigError
from autoplan.hardware import ClusterSpec, cluster
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.plan_rules import validate_plan

log = logging.getLogger(__name__)


def load_cluster(plan: Plan) -> ClusterSpec:
    """The plan's cluster, or one ConfigError naming cluster.profile: what `autoplan train`
    requires before it launches (the memory check, the precision check and the summary's
    prediction all price the plan on it). A plan file's relative path was made absolute from
    the plan's folder when it was read (plan_files.plan_file_paths)."""
    from autoplan.profile_files import profile_names

    ref = plan.cluster.profile
    try:
        return cluster(ref, plan.cluster.num_gpus)
    except ConfigError as err:
        named = resources.is_name(ref)
        if (resources.find(resources.PROFILES, ref) is None) if named else not Path(ref).exists():
            where = (f"no profile of that name ({', '.join(profile_names())})" if named
                     else "no such file")
            raise ConfigError("cluster.profile", f"{ref!r} cannot be loaded: {where}",
                              "give a path that exists (a relative one from the plan's folder), "
                              "or a profile name") from None
        raise ConfigError("cluster.profile", f"{ref!r} cannot be loaded ({err})",
                          "fix the profile, or name another one") from None


def plan_cluster(plan: Plan) -> ClusterSpec | None:
    """The plan's cluster, or None where its profile cannot be loaded here: the rules then
    skip only the device's precision check. Only the ranks take None, and only for a job a
    scheduler started without the launcher (an exported job on another site, whose profile
    file may stay on the machine the plan was searched on); the launcher refuses such a plan
    first (load_cluster), so a run it starts always has its profile."""
    try:
        return cluster(plan.cluster.profile, plan.cluster.num_gpus)
    except AutoplanError as err:
        log.info("cannot load cluster %r (%s); precision not checked against a device",
                 plan.cluster.profile, err)
        return None


def runtime_problems(plan: Plan, spec: ModelSpec) -> list[str]:
    """Reasons this runtime cannot execute `plan` for `spec` (empty if it can): the plan
    rules of autoplan.plan_rules; the rules search and estimate hold autoplan's runtime on
    this machine's device to (cost/runtime_rules.refusals of its traits, autoplan-cuda or
    autoplan-cpu, which add plan_rules.RUNTIME_RULES: what only this runtime lacks, MoE
    capacity, ETP, ...); and what this machine lacks for it (fp8)."""
    import torch

    from autoplan.cost.runtime_rules import refusals
    from autoplan.cost.runtimes import load_runtime
    from autoplan.runtime.float8 import fp8_problem

    traits = load_runtime("autoplan", on_cpu=not torch.cuda.is_available())
    problems = validate_plan(plan, spec, plan_cluster(plan)) + refusals(plan, traits, spec)
    fp8 = fp8_problem(plan)
    return problems + ([fp8] if fp8 else [])


def check_plan(plan: Plan, spec: ModelSpec, world_size: int | None = None) -> None:
    """Raise one ConfigError listing every problem once; world_size is the launched process
    count. Its fix names --nproc only where the process count is one of the problems."""
    problems = runtime_problems(plan, spec)
    fix = "fix the plan"
    if world_size is not None and world_size != plan.world_size:
        p = plan.parallel
        nproc = f"pass --nproc {plan.world_size} (or leave it out: the plan's world size)"
        count = f"{world_size} process{'es' if world_size > 1 else ''}"
        fix = f"{nproc}, or re-plan for {count}" if not problems \
            else f"fix the plan, and {nproc}"
        problems.insert(0, f"world size {world_size} != plan's dp*tp*pp*cp = {p.dp}*{p.tp}*"
                           f"{p.pp}*{p.cp} = {plan.world_size}")
    if problems:
        raise ConfigError("plan", "; ".join(problems), fix)
