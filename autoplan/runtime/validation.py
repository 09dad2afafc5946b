"""What the runtime itself needs of a plan, checked before any process trains.

Each problem is a ConfigError (exit 2) that names the field, the values and the fix. The
planner-wide rules (autoplan.plan_rules.validate_plan) are applied too when that module exists.
"""

from __future__ import annotations

import importlib
import logging

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, RecomputePolicy, Schedule

log = logging.getLogger(__name__)


def runtime_problems(plan: Plan, spec: ModelSpec) -> list[str]:
    """Reasons this runtime cannot execute `plan` for `spec` (empty if it can)."""
    p, out = plan.parallel, []
    tp, dp = p.tp, p.dp
    out += _context_parallel_problems(plan, spec)
    for name, value in (("num_heads", spec.num_heads), ("num_kv_heads", spec.kv_heads),
                        ("ffn_hidden_size", spec.ffn), ("vocab_size", spec.vocab_size)):
        if value % tp:
            out.append(f"parallel.tp={tp} does not divide model.{name}={value}")
    if plan.sequence_parallel and spec.seq_len % tp:
        out.append(f"sequence_parallel: tp={tp} does not divide seq_len={spec.seq_len}")
    gbs, mbs = plan.batch.global_batch_size, plan.batch.micro_batch_size
    if gbs % dp:
        out.append(f"batch.global_batch_size={gbs} is not divisible by dp={dp}")
    elif (gbs // dp) % mbs:
        out.append(f"local batch {gbs // dp} (global {gbs} / dp {dp}) is not a multiple of "
                   f"micro_batch_size={mbs} (an uneven split hangs the pipeline)")
    n_micro = max(1, (gbs // dp) // mbs)
    out += _pipeline_problems(plan, spec, n_micro)
    if (plan.offload.optimizer or plan.offload.params) and plan.zero_stage == 0:
        out.append("offload needs zero_stage >= 1 (FSDP2 offloads sharded states)")
    return out


def _context_parallel_problems(plan: Plan, spec: ModelSpec) -> list[str]:
    """cp splits the sequence into 2*cp chunks (context_parallel.py); sequence parallelism then
    splits each rank's seq_len/cp tokens over tp."""
    cp, tp, s = plan.parallel.cp, plan.parallel.tp, spec.seq_len
    if cp == 1:
        return []
    if s % (2 * cp):
        return [f"parallel.cp={cp}: model.seq_len={s} is not divisible by 2*cp={2 * cp} (the "
                f"load-balanced layout cuts it into 2*cp chunks); pick a cp that divides {s}/2"]
    if plan.sequence_parallel and (s // cp) % tp:
        return [f"sequence_parallel: tp={tp} does not divide the per-cp-rank sequence "
                f"seq_len/cp = {s}/{cp} = {s // cp}; lower tp or cp"]
    return []


def _pipeline_problems(plan: Plan, spec: ModelSpec, n_micro: int) -> list[str]:
    out: list[str] = []
    pp, vpp, sched = plan.parallel.pp, plan.pipeline.vpp, plan.pipeline.schedule
    stages = pp * vpp if pp > 1 else 1
    if pp == 1:
        if vpp > 1:
            out.append(f"pipeline.vpp={vpp} needs pp > 1")
        return out
    if vpp > 1 and sched not in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE):
        out.append(f"pipeline.vpp={vpp} needs schedule interleaved-1f1b or zero-bubble")
    lps = plan.pipeline.layers_per_stage
    if lps is not None:
        if len(lps) != stages or sum(lps) != spec.num_layers:
            out.append(f"pipeline.layers_per_stage={list(lps)} must list {stages} stages "
                       f"summing to num_layers={spec.num_layers}")
    elif spec.num_layers < stages:
        out.append(f"num_layers={spec.num_layers} < pp*vpp={stages} stages")
    if sched != Schedule.GPIPE and n_micro < pp:
        out.append(f"schedule {sched.value} needs micro-batches per step ({n_micro}) >= pp={pp}")
    if sched == Schedule.ZERO_BUBBLE and plan.recompute.policy == RecomputePolicy.SELECTIVE:
        # zero-bubble runs backward in two passes (input grads, then weight grads); selective
        # checkpointing allows one backward per region ("Trying to backward an extra time")
        out.append("schedule zero-bubble cannot use selective recompute; use full or none")
    if sched in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE) and n_micro % pp:
        out.append(f"schedule {sched.value} needs micro-batches per step ({n_micro}) to be a "
                   f"multiple of pp={pp}")
    return out


def planner_problems(plan: Plan, spec: ModelSpec) -> list[str]:
    """autoplan.plan_rules.validate_plan(plan, model, cluster), when that module exists."""
    try:
        rules = importlib.import_module("autoplan.plan_rules")
    except ImportError:
        return []
    validate = getattr(rules, "validate_plan", None)
    if validate is None:
        return []
    try:
        hardware = importlib.import_module("autoplan.hardware")
        cluster = hardware.cluster(plan.cluster.profile, plan.cluster.num_gpus)
    except Exception as err:  # the cluster profile is optional for running locally
        log.info("plan_rules skipped: cannot load cluster %r (%s)", plan.cluster.profile, err)
        return []
    return list(validate(plan, spec, cluster))


def check_plan(plan: Plan, spec: ModelSpec, world_size: int | None = None) -> None:
    """Raise one ConfigError listing every problem; world_size is the launched process count."""
    problems = runtime_problems(plan, spec)
    if world_size is not None and world_size != plan.world_size:
        p = plan.parallel
        problems.insert(0, f"world size {world_size} != plan's dp*tp*pp*cp = {p.dp}*{p.tp}*"
                           f"{p.pp}*{p.cp} = {plan.world_size}")
    problems += [r for r in planner_problems(plan, spec) if r not in problems]
    if problems:
        raise ConfigError("plan", "; ".join(problems), "fix the plan or pass a matching --nproc")
