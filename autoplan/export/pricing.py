"""What an export says and checks of the plan as the target's engine runs it: the runtime-traits
preset each target is priced with, the price line export prints, and the memory check that
refuses (exit 3) a job whose ranks would run out of memory."""

from __future__ import annotations

import logging

from autoplan.errors import ConfigError, InfeasiblePlanError
from autoplan.export.nodes import written_cluster
from autoplan.hardware import ClusterSpec, load_profile

log = logging.getLogger(__name__)

TARGET_RUNTIMES = {"deepspeed": "deepspeed", "megatron": "megatron", "torchtitan": "torchtitan",
                   "torchtitan/python": "torchtitan-0.3"}
"""The runtime-traits preset each target's engine is priced with (torchtitan's Python config is
torchtitan 0.3's, its TOML 0.2.2's); slurm, kubernetes and torchrun launch autoplan's own
runtime."""


def price_for_target(plan, model, target: str, torchtitan_format: str = "toml",
                     cluster: ClusterSpec | None = None) -> str:
    """One line: the plan's step time and memory as the target's engine would run it on
    `cluster` (default: the plan's profile; an export passes nodes.written_cluster, the node
    size it writes)."""
    from autoplan.cost.estimate import estimate_plan

    est = estimate_plan(plan, cluster, model=model,
                        runtime=target_runtime(target, torchtitan_format))
    line = (f"priced for {est.runtime}: step {est.step_time_s:.3g} s ± {est.error_band:.0%}, "
            f"{est.memory['total'] / 2**30:.1f} GiB per GPU")
    if not est.feasible:  # memory it lacks, or a feature it lacks: the reasons say which
        line += f"; {est.runtime} cannot run it as planned: {'; '.join(est.reasons)}"
    return line


def target_runtime(target: str, torchtitan_format: str = "toml") -> str | None:
    """The runtime-traits preset `target`'s engine is priced with (TARGET_RUNTIMES); None for
    the launchers, which run autoplan's own runtime on the plan's device."""
    key = f"{target}/{torchtitan_format}" if target == "torchtitan" else target
    return TARGET_RUNTIMES.get(key, TARGET_RUNTIMES.get(target))


def check_fits(path: str, plan, model, runtime: str | None, gpus_per_node: int) -> None:
    """Refuse (exit 3) to write what would run out of memory: a launcher's job of a plan that
    does not fit as autoplan's runtime holds it (the check `autoplan train`'s launcher makes,
    which the job's ranks, started by torchrun, do not make again), a framework's config of one
    that does not fit as its engine (`runtime`) holds it (cost.estimate.memory_misses), on
    nodes of the `gpus_per_node` written (host memory is per node). A profile this machine
    cannot load (another site's) is not checked here."""
    from autoplan.cost.estimate import memory_misses

    try:
        cluster = written_cluster(plan, gpus_per_node)
    except ConfigError as err:  # another site's profile: written for the GPUs it names
        log.warning("memory not checked and the job written for GPUs: the plan's profile does "
                    "not load here (%s)", err.problem)
        return
    est, misses = memory_misses(plan, cluster, model, runtime)
    if misses:
        resized = "" if gpus_per_node == load_profile(plan.cluster.profile).gpus_per_node \
            else f" on nodes of {gpus_per_node} GPUs"
        search = "`autoplan search" + (f" --runtime {runtime}`" if runtime else "`")
        raise InfeasiblePlanError(
            f"plan {path} does not fit {cluster.num_gpus} x {plan.cluster.profile}{resized} as "
            f"{est.runtime} runs it: {'; '.join(misses)}; its ranks would run out of "
            f"memory: choose a plan that fits ({search}), or pass --no-memory-check to write "
            "it anyway")
