"""Which plans `autoplan tune` runs: the user's --plan files, checked against the tune's request,
and the search's best, one per layout first."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan, plan_from_dict
from autoplan.plan_files import plan_file_paths
from autoplan.yaml_io import read_yaml

LAYOUT_COLUMNS = ("dp", "tp", "pp", "cp", "ep", "etp", "dp_shard", "mbs", "schedule", "vpp")
"""The columns that make a layout: the plan's degrees, micro-batch size and pipeline shape."""


def search_candidates(args: argparse.Namespace) -> list[tuple[Plan, str]]:
    """The search's best plans, one per layout first; NoFeasiblePlanError (exit 3) naming the
    nearest miss when nothing is feasible."""
    from autoplan.search.cli import build_request
    from autoplan.search.engine import run_search
    from autoplan.search.output import plans, summary
    from autoplan.search.summary import infeasible_line

    ns = argparse.Namespace(
        model=args.model, cluster=args.cluster, num_gpus=str(args.num_gpus),
        global_batch_size=args.global_batch_size, seq_len=args.seq_len, space=args.space,
        objective="throughput", max_step_time_s=None, min_tokens_per_s=None,
        deadline_days=None, train_tokens=None, sampler=None, trials=300, seed=0, storage=None,
        study=None, worker=0, top=args.top, runtime=None)  # autoplan's own runtime: tune runs it
    result = run_search(build_request(ns))
    if result.best is None:
        raise NoFeasiblePlanError(infeasible_line(summary(result, 1)))
    ranks = picked_ranks(result.scored.cols, result.order, args.top)
    built = plans(result, result.order[ranks])  # Plans for the picked rows only
    return [(p, f"model rank {r + 1}") for p, r in zip(built, ranks, strict=True)]


def picked_ranks(cols: dict[str, np.ndarray], order: np.ndarray, top: int) -> np.ndarray:
    """Positions in `order` (best first) of the plans to run: the best of each layout first
    (the cost model's near-ties, e.g. ZeRO-1 vs ZeRO-2 on a few ranks, teach a tune little),
    then the rest in rank order, `top` in all; judged on the columns, without building Plans."""
    names = [c for c in LAYOUT_COLUMNS if c in cols]
    keys = np.stack([np.asarray(cols[c])[order].astype(np.int64) for c in names], axis=1)
    _, first = np.unique(keys, axis=0, return_index=True)
    first = np.sort(first)[:top]
    if len(first) == top:
        return first
    rest = np.setdiff1d(np.arange(len(order)), first)[:top - len(first)]
    return np.concatenate([first, rest]).astype(np.int64)


def tune_candidates(args: argparse.Namespace) -> list[Any]:
    """The user's --plan files (each for this tune's model, sequence length, global batch size
    and --num-gpus ranks) and the search's best, deduplicated (tune.study.make_candidates);
    none at all is an infeasible request (exit 3)."""
    from autoplan.plan_args import resolve_model
    from autoplan.tune.study import make_candidates

    model = resolve_model(args)
    user = [(user_plan(path, model, args), "user") for path in args.plan]
    try:
        found = search_candidates(args)
    except NoFeasiblePlanError:
        if not user:
            raise
        found = []  # the user's plans still run
    return make_candidates(user + found)


def user_plan(path: str, model: ModelSpec, args: argparse.Namespace) -> Plan:
    """A --plan file, refused (exit 2, both values) unless it trains this tune's model, with
    its sequence length and global batch size, on --num-gpus ranks of the --cluster profile:
    trials are only comparable when every plan trains the same tokens per step, and a plan's
    prediction (which orders the trials and is calibrated against) is priced on its own
    profile."""
    from autoplan.hardware import load_profile

    data = read_yaml(path, "--plan")
    if not isinstance(data, dict):
        raise ConfigError("--plan", f"{path} is not a mapping of plan fields")
    try:
        plan = plan_from_dict(plan_file_paths(data, path))  # its paths from its folder
        spec = plan.model_spec()
    except ConfigError as err:
        raise ConfigError(f"--plan {path}: {err.field}", err.problem, err.fix) from None
    checks = (
        ("--num-gpus", "ranks", plan.world_size, args.num_gpus),
        ("--model", "model", spec.name if spec.replace(seq_len=model.seq_len) == model
         or spec.name != model.name else f"{spec.name} (another spec)", model.name),
        ("--seq-len", "seq_len", spec.seq_len, model.seq_len),
        ("--global-batch-size", "batch.global_batch_size", plan.batch.global_batch_size,
         args.global_batch_size),
        # a name and a path to the same profile are the same profile
        ("--cluster", "cluster.profile", plan.cluster.profile
         if load_profile(plan.cluster.profile) != load_profile(args.cluster) else args.cluster,
         args.cluster),
    )
    for flag, name, got, want in checks:
        if got != want:
            raise ConfigError("--plan", f"{path} has {name} {got}, but this tune has {flag} {want}",
                              f"give a plan for {flag} {want}, or tune with {flag} {got}")
    # what `autoplan train` would refuse, refused before a trial is spent on it
    from autoplan.runtime.validation import runtime_problems
    problems = runtime_problems(plan, spec)
    if problems:
        raise ConfigError("--plan", f"{path} cannot train here: {'; '.join(problems)}",
                          "fix the plan, or tune without it")
    return plan
