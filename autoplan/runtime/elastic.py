"""Elastic re-plan: the plan for the ranks present, when a job's world shrinks or grows.

`autoplan train PLAN --elastic` runs under torchrun's elastic agent (`--nnodes=MIN:MAX`, c10d
rendezvous): when a node dies the survivors re-rendezvous and restart their workers with a
smaller WORLD_SIZE (a node that joins makes it larger). That is how SLURM and Kubernetes jobs
already run torchrun (the Kubeflow operators and `srun torchrun` set the same variables), so
the same mechanism works on one machine, under a scheduler and in the exports; the re-plan
itself happens inside the workers, which see WORLD_SIZE != the plan's world size.

`replan` is a pure function of the plan file and the ranks present: the same model, global
batch, precision, hardware profile, objectives and runtime the plan was searched for (its
`predicted` block names the runtime and objectives; a plan does not record its search space,
so the space is a flag, by default search's own default), on nodes of the size the job runs
(an export's --gpus-per-node, handed over in export.nodes.NODE_SIZE_ENV; else the profile's).
It takes the largest world size <= present with a feasible plan (the plan itself at its own
size); ranks above it sit idle.
Rank 0 computes it and hands the YAML to the others through the job's store (worker.py), so
every rank runs the same plan whatever the float round-off of its machine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.plan import Plan
from autoplan.plan_files import load_plan, plan_to_dict, save_plan
from autoplan.yaml_io import dump_yaml

log = logging.getLogger(__name__)

DEFAULT_SPACE = "default"
"""`autoplan search`'s default --space, which the plan was most likely searched in."""
SHOWN = 3
"""Skipped world sizes the block names one by one (1023 of GPT-3's 1024 GPUs skips 159)."""
REPLAN_WAIT_S = 1800.0
"""How long ranks wait for rank 0's re-plan (re-planning 1023 of 1024 GPUs for GPT-3 175B
searches 160 world sizes in ~10 s here; a dead rank 0 ends the wait at once)."""
PLANS_DIR = "elastic-plans"
"""Folder inside --checkpoint-dir where each re-plan is saved (never overwritten)."""


@dataclass(frozen=True)
class Replan:
    """The plan for `present` ranks: it uses `plan.world_size` of them, the rest sit idle."""

    plan: Plan
    present: int
    original_world: int
    skipped: tuple[tuple[int, str], ...] = ()
    """(world size, why no plan fits it) for every larger world tried first."""
    space: str = DEFAULT_SPACE
    runtime: str | None = None
    gpus_per_node: int | None = None
    """GPUs per node the re-plan priced (None: the profile's)."""

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def changed(self) -> bool:
        return self.world_size != self.original_world

    @property
    def idle_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.world_size, self.present))


def plan_objectives(plan: Plan) -> tuple[str, ...]:
    """The objectives the plan was ranked by (search writes `objective_NAME` into predicted)."""
    from autoplan.search.targets import OBJECTIVES

    keys = (plan.predicted or {}).keys()
    found = tuple(o for o in OBJECTIVES if f"objective_{o}" in keys)
    return found or ("throughput",)


def plan_runtime(plan: Plan) -> str | None:
    """The runtime the plan was priced for (search's predicted.runtime), or None (default)."""
    value = (plan.predicted or {}).get("runtime")
    return value if isinstance(value, str) and value else None


def job_gpus_per_node() -> int | None:
    """GPUs per node of the job as its export wrote them (NODE_SIZE_ENV), None where it does
    not say (a job not written by an elastic export: the profile's node size)."""
    from autoplan.export.nodes import NODE_SIZE_ENV
    from autoplan.hardware import MAX_GPUS_PER_NODE

    raw = os.environ.get(NODE_SIZE_ENV)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6
            and 1 <= int(raw) <= MAX_GPUS_PER_NODE):
        raise ConfigError(NODE_SIZE_ENV, f"got {raw[:40]!r}", f"expected 1 to "
                          f"{MAX_GPUS_PER_NODE} GPUs in one node, as `autoplan export "
                          "--gpus-per-node` writes it, or unset it for the profile's")
    return int(raw)


def _request(plan: Plan, world: int, space: str, gpus_per_node: int | None = None):
    from autoplan.cost.runtimes import load_runtime
    from autoplan.export.nodes import profile_on_nodes
    from autoplan.search.engine import SearchRequest
    from autoplan.search.targets import Targets
    from autoplan.search_space import load_space

    profile = profile_on_nodes(plan.cluster.profile, gpus_per_node)
    # the precision stays the plan's: a re-plan changes the layout, not the numerics
    searched = dataclasses.replace(load_space(space), precision=(plan.precision,))
    return SearchRequest(
        model=plan.model_spec(), model_ref=plan.model, profile=profile,
        profile_ref=plan.cluster.profile, space=searched, gpu_counts=(world,),
        global_batch_size=plan.batch.global_batch_size,
        targets=Targets(objectives=plan_objectives(plan)),
        runtime=load_runtime(plan_runtime(plan), on_cpu=profile.is_cpu))


def elastic_space(args) -> str:
    """The space an --elastic job re-plans in: `train --space`, else DEFAULT_SPACE."""
    return getattr(args, "space", None) or DEFAULT_SPACE


def search_world(plan: Plan, world: int, space: str = DEFAULT_SPACE,
                 gpus_per_node: int | None = None):
    """(best plan or None, one line on why nothing fits) for exactly `world` ranks on nodes
    of `gpus_per_node` GPUs (None: the profile's)."""
    import numpy as np

    from autoplan.search.engine import run_search
    from autoplan.search.output import plans, summary
    from autoplan.search.summary import infeasible_line

    result = run_search(_request(plan, world, space, gpus_per_node))
    if result.best is None:
        return None, infeasible_line(summary(result, 1))
    return plans(result, np.array([result.best]))[0], ""


def replan(plan: Plan, present: int, *, space: str = DEFAULT_SPACE,
           min_world: int = 1, gpus_per_node: int | None = None) -> Replan:
    """The plan for the largest world in [min_world, present] that has a feasible one, on
    nodes of `gpus_per_node` GPUs (None: the profile's).

    Raises NoFeasiblePlanError (exit 3) with the nearest miss at `present` when none has, and
    ConfigError (exit 2) for a present count below min_world."""
    if present < 1:
        raise ConfigError("WORLD_SIZE", f"got {present}", "expected at least 1 rank")
    if min_world < 1:
        raise ConfigError("--min-gpus", f"got {min_world}", "expected at least 1")
    runtime = plan_runtime(plan)
    if present < min_world:
        raise NoFeasiblePlanError(f"--elastic: {present} rank(s) present, fewer than "
                                  f"--min-gpus {min_world}; add GPUs or lower --min-gpus")
    skipped: list[tuple[int, str]] = []
    for world in range(present, min_world - 1, -1):
        if world == plan.world_size:  # the plan itself, valid for its own world
            return Replan(plan, present, plan.world_size, tuple(skipped), space, runtime,
                          gpus_per_node)
        found, why = search_world(plan, world, space, gpus_per_node)
        if found is None:
            skipped.append((world, why))
            continue
        return Replan(found, present, plan.world_size, tuple(skipped), space, runtime,
                      gpus_per_node)
    first = skipped[0][1] if skipped else "nothing to try"
    nodes = "" if gpus_per_node is None else f" on {gpus_per_node}-GPU nodes"
    raise NoFeasiblePlanError(
        f"--elastic: no feasible plan for {min_world} to {present} GPUs of "
        f"{plan.cluster.profile}{nodes} (global batch {plan.batch.global_batch_size}, space "
        f"{space}); at {present}: {first}")


def describe(r: Replan, plan_name: str, saved: Path | None = None) -> str:
    """The block the job prints when it re-plans: what changed, the new plan, its prediction."""
    p, par = r.plan, r.plan.parallel
    lines = [f"autoplan elastic: {r.present} rank(s) present; {plan_name} was planned for "
             f"{r.original_world}"]
    lines += [f"  no feasible plan for {w} ranks: {why}" for w, why in r.skipped[:SHOWN]]
    if len(r.skipped) > SHOWN:
        lines.append(f"  no feasible plan for {len(r.skipped) - SHOWN} more world sizes, "
                     f"{r.skipped[SHOWN][0]} down to {r.skipped[-1][0]}")
    idle = f" (rank(s) {_ranges(r.idle_ranks)} idle)" if r.idle_ranks else ""
    lines.append(
        f"  new plan for {r.world_size} ranks{idle}: dp={par.dp} tp={par.tp} pp={par.pp} "
        f"cp={par.cp} sp={p.sequence_parallel} zero={p.zero_stage} "
        f"mbs={p.batch.micro_batch_size} gbs={p.batch.global_batch_size} "
        f"schedule={p.pipeline.schedule.value} vpp={p.pipeline.vpp} "
        f"recompute={p.recompute.policy.value} precision={p.precision.value}")
    nodes = "" if r.gpus_per_node is None else f", {r.gpus_per_node}-GPU nodes"
    lines.append("  predicted: " + prediction_line(p) + f" (space {r.space}, runtime "
                 f"{r.runtime or 'autoplan'}{nodes})")
    if saved is not None:
        lines.append(f"  saved as {saved}")
    lines.append("  resuming from the newest complete checkpoint (DCP reshards it)")
    return "\n".join(lines)


def prediction_line(plan: Plan) -> str:
    pred = plan.predicted or {}
    parts = []
    if isinstance(pred.get("step_time_s"), (int, float)):
        parts.append(f"{pred['step_time_s']:.4g} s/step")
    if isinstance(pred.get("tokens_per_s"), (int, float)):
        parts.append(f"{pred['tokens_per_s']:,.0f} tokens/s")
    if isinstance(pred.get("memory_bytes"), dict) and "total" in pred["memory_bytes"]:
        parts.append(f"{pred['memory_bytes']['total'] / 2**30:.3g} GiB per GPU")
    if isinstance(pred.get("mfu"), (int, float)):
        parts.append(f"MFU {100 * pred['mfu']:.2g}%")
    return ", ".join(parts) or "none recorded"


def _ranges(ranks: tuple[int, ...]) -> str:
    if len(ranks) == 1:
        return str(ranks[0])
    return f"{ranks[0]}-{ranks[-1]}"


def save_replan(r: Replan, checkpoint_dir: str | Path) -> Path:
    """Save the new plan as CKPT/elastic-plans/plan-{N}gpus.yaml; the same plan already saved
    there is reused, a different one gets the next free -2, -3, ... name (nothing is
    overwritten)."""
    folder = Path(checkpoint_dir) / PLANS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"plan-{r.world_size}gpus"
    for k in range(1, 10_000):
        path = folder / (f"{stem}.yaml" if k == 1 else f"{stem}-{k}.yaml")
        if not path.exists():
            return save_plan(r.plan, path)
        try:
            if load_plan(path) == r.plan:
                return path
        except ConfigError:
            continue
    raise ConfigError("--checkpoint-dir", f"{folder} holds 9,999 {stem} files",
                      "remove old re-plans")


def to_text(plan: Plan) -> str:
    """The plan as the YAML text rank 0 hands to the other ranks."""
    return dump_yaml(plan_to_dict(plan))


def from_text(text: str) -> Plan:
    from autoplan.plan import plan_from_dict
    from autoplan.yaml_parse import safe_load_text

    return plan_from_dict(safe_load_text(text, "elastic plan"))


PLAN_KEY, DONE_KEY, LEFT_KEY = "elastic/plan", "elastic/done", "elastic/left"
_ERROR = "error:"


def agree_on_plan(store, rank: int, present: int, args) -> Replan:
    """Rank 0 re-plans for `present` ranks and puts the YAML (or its error) in the job's
    store; every rank reads the same bytes back, so all run the same plan. Rank 0 prints the
    block and saves the plan beside the checkpoints when the plan changed."""
    if rank == 0:
        try:
            original = load_plan(args.plan)
            r = replan(original, present, space=elastic_space(args),
                       min_world=args.min_gpus or 1, gpus_per_node=job_gpus_per_node())
            store.set(PLAN_KEY, to_text(r.plan).encode())
        except (ConfigError, NoFeasiblePlanError) as err:
            store.set(PLAN_KEY, f"{_ERROR}{type(err).__name__}:{err}".encode())
            raise
        if r.changed:
            saved = save_replan(r, args.checkpoint_dir) if args.checkpoint_dir else None
            log.warning("%s", describe(r, Path(args.plan).name, saved))
        return r
    import datetime

    store.wait([PLAN_KEY], datetime.timedelta(seconds=REPLAN_WAIT_S))
    text = store.get(PLAN_KEY).decode()
    if text.startswith(_ERROR):
        kind, _, message = text[len(_ERROR):].partition(":")
        if kind == "NoFeasiblePlanError":
            raise NoFeasiblePlanError(message)
        raise ConfigError("", message)
    original = load_plan(args.plan)
    new = from_text(text)
    return Replan(new, present, original.world_size, space=elastic_space(args),
                  runtime=plan_runtime(original), gpus_per_node=job_gpus_per_node())


def wait_idle(store, rank: int, r: Replan, stopped) -> None:
    """An idle rank (the re-plan uses fewer ranks than are present): wait until rank 0 says
    the job is done, so this node's agent stays in the job (a later re-rendezvous, e.g. when a
    node joins, can use it again). A broken store (the job failed) raises, and the agent
    restarts this worker with the others."""
    import time

    log.warning("rank %d idle: the elastic re-plan uses %d of %d ranks", rank, r.world_size,
                r.present)
    while not stopped():
        if store.check([DONE_KEY]):  # raises when the store is gone (the job failed)
            store.set(f"{LEFT_KEY}/{rank}", b"1")  # rank 0 may host the store: it waits
            return
        time.sleep(0.5)


def release_idle(store, r: Replan, timeout_s: float = 30.0) -> None:
    """Rank 0, after the last step: the idle ranks may leave. Waits (at most `timeout_s`) until
    they have seen it, since rank 0's worker may host the store they poll."""
    import datetime

    store.set(DONE_KEY, b"1")
    keys = [f"{LEFT_KEY}/{k}" for k in r.idle_ranks]
    if keys:
        try:
            store.wait(keys, datetime.timedelta(seconds=timeout_s))
        except Exception as err:  # DistStoreError on a timeout: an idle rank gone already
            log.warning("idle ranks did not acknowledge the end of the job: %s", err)
