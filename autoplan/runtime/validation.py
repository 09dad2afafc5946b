"""What the runtime needs of a plan, checked before any process trains.

There is one rule set, `autoplan.plan_rules` (the planner's): the runtime judges a plan by it
and adds only what depends on the launch (the process count). Every problem is listed once, in
the rule's own words, in one ConfigError (exit 2).
"""

from __future__ import annotations

import logging

from autoplan.errors import AutoplanError, ConfigError
from autoplan.hardware import ClusterSpec, cluster
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.plan_rules import runtime_limits, validate_plan

log = logging.getLogger(__name__)


def plan_cluster(plan: Plan) -> ClusterSpec | None:
    """The plan's cluster, or None where its profile cannot be loaded here (a profile file
    of another machine): the rules then skip only the device's precision check."""
    try:
        return cluster(plan.cluster.profile, plan.cluster.num_gpus)
    except AutoplanError as err:
        log.info("cannot load cluster %r (%s); precision not checked against a device",
                 plan.cluster.profile, err)
        return None


def runtime_problems(plan: Plan, spec: ModelSpec) -> list[str]:
    """Reasons this runtime cannot execute `plan` for `spec` (empty if it can): the plan
    rules of autoplan.plan_rules, its RUNTIME_RULES (what only this runtime lacks: MoE
    capacity, ETP, ...), and what this machine lacks for it (fp8)."""
    from autoplan.runtime.float8 import fp8_problem

    problems = validate_plan(plan, spec, plan_cluster(plan)) + runtime_limits(plan, spec)
    fp8 = fp8_problem(plan)
    return problems + ([fp8] if fp8 else [])


def check_plan(plan: Plan, spec: ModelSpec, world_size: int | None = None) -> None:
    """Raise one ConfigError listing every problem once; world_size is the launched process
    count."""
    problems = runtime_problems(plan, spec)
    if world_size is not None and world_size != plan.world_size:
        p = plan.parallel
        problems.insert(0, f"world size {world_size} != plan's dp*tp*pp*cp = {p.dp}*{p.tp}*"
                           f"{p.pp}*{p.cp} = {plan.world_size}")
    if problems:
        raise ConfigError("plan", "; ".join(problems), "fix the plan or pass a matching --nproc")
