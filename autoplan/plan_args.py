"""Building a Plan from command-line flags: a plan file, --model/--cluster/--num-gpus overrides,
and typed `--set key=value` edits, all validated by the strict plan loader."""

from __future__ import annotations

import argparse
from typing import Any

from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, available_profiles, load_profile
from autoplan.model_spec import PRESETS, ModelSpec, load_model
from autoplan.plan import Plan, plan_from_dict, plan_to_dict, set_field
from autoplan.yaml_io import read_yaml


def add_target_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--model", required=required,
                        help=f"preset ({', '.join(list(PRESETS)[:4])}, ...), model YAML or config.json")
    parser.add_argument("--cluster", required=required,
                        help=f"hardware profile ({', '.join(available_profiles())}) or a path")
    parser.add_argument("--num-gpus", type=int, required=required, help="GPUs in the job")
    parser.add_argument("--seq-len", type=int, help="override the model's sequence length")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", help="plan YAML (default: plain data parallel over all GPUs)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="edit a plan field, e.g. --set parallel.tp=8 (repeatable)")
    parser.add_argument("--global-batch-size", type=int, help="sequences per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, help="sequences per micro-batch")


def resolve_model(args: argparse.Namespace, fallback: Any = None) -> ModelSpec:
    ref = args.model or fallback
    if ref is None:
        raise ConfigError("--model", "missing", "give --model or a plan that names one")
    model = load_model(ref)
    if getattr(args, "seq_len", None) is not None:
        if args.seq_len <= 0:
            raise ConfigError("--seq-len", f"got {args.seq_len}", "expected a positive integer")
        model = model.replace(seq_len=args.seq_len)
    return model


def plan_from_args(args: argparse.Namespace) -> tuple[Plan, ModelSpec, ClusterSpec]:
    """The plan named by --plan (or a data-parallel default), with flags and --set applied."""
    data: dict[str, Any]
    if args.plan:
        raw = read_yaml(args.plan, "--plan")
        if not isinstance(raw, dict):
            raise ConfigError("--plan", f"{args.plan!r} is not a mapping of plan fields")
        data = raw
    else:
        if args.num_gpus is None:
            raise ConfigError("--num-gpus", "missing", "give --num-gpus or --plan")
        data = {"parallel": {"dp": args.num_gpus}}
    if "cluster" in data and not isinstance(data["cluster"], dict):
        raise ConfigError("cluster", f"got {data['cluster']!r}",
                          "expected a mapping: {profile: NAME, num_gpus: N}")
    cluster_ref = dict(data.get("cluster") or {})
    if args.cluster:
        cluster_ref["profile"] = args.cluster
    if args.num_gpus is not None:
        cluster_ref["num_gpus"] = args.num_gpus
    data["cluster"] = cluster_ref
    if args.model:
        data["model"] = args.model
    batch = dict(data.get("batch") or {}) if isinstance(data.get("batch"), dict) else {}
    if args.global_batch_size is not None:
        batch["global_batch_size"] = args.global_batch_size
    if args.micro_batch_size is not None:
        batch["micro_batch_size"] = args.micro_batch_size
    batch.setdefault("micro_batch_size", 1)
    dp = (data.get("parallel") or {}).get("dp", 1) if isinstance(data.get("parallel"), dict) else 1
    batch.setdefault("global_batch_size", batch["micro_batch_size"] * (dp if isinstance(dp, int) else 1))
    data["batch"] = batch
    for assignment in args.set:
        set_field(data, assignment)
    for section in ("cluster", "batch"):
        if not isinstance(data.get(section), dict):
            raise ConfigError(section, f"got {data.get(section)!r}", "expected a mapping")
    if "model" not in data:
        raise ConfigError("--model", "missing", "give --model or a plan that names one")
    if "profile" not in data["cluster"]:
        raise ConfigError("--cluster", "missing", "give --cluster or a plan that names one")
    plan = plan_from_dict(data)
    model = resolve_model(args, plan.model)
    if getattr(args, "seq_len", None):
        plan = plan.replace(model=model)
    cluster = ClusterSpec(load_profile(plan.cluster.profile), plan.cluster.num_gpus)
    return plan, model, cluster


__all__ = ["add_plan_arguments", "add_target_arguments", "plan_from_args", "plan_to_dict"]
