"""Building a Plan from command-line flags: a plan file, --model/--cluster/--num-gpus overrides,
and typed `--set key=value` edits, all validated by the strict plan loader."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from autoplan.cli_common import BINARY_NOTE, count
from autoplan.cost.runtimes import RUNTIMES
from autoplan.display import count as count_text
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.model_spec import MAX_SIZE, PRESETS, ModelSpec, load_model
from autoplan.plan import ClusterRef, Plan, check_plan_keys, check_section_keys, plan_from_dict
from autoplan.plan_files import plan_file_paths, plan_to_dict
from autoplan.plan_sets import apply_sets
from autoplan.profile_files import available_profiles
from autoplan.search_space import device_precision
from autoplan.yaml_io import read_yaml, show
from autoplan.yaml_parse import safe_load_text

log = logging.getLogger(__name__)

SEQ_LEN = count(suffixes="binary", example="8192 or 8k")
"""--seq-len's type, for every command that takes it: sequence lengths are powers of two, so
k is 1024 (Llama 3.1's "128K context" is 131,072)."""
SEQ_LEN_HELP = f"override the model's sequence length, e.g. 8192 or 8k ({BINARY_NOTE})"
MAX_BATCH_TOKENS = 2**28
"""Most tokens a global batch may hold (268M): 4x the largest published pre-training batch,
DeepSeek-V3's 15,360 sequences x 4,096 = 63M tokens (arXiv 2412.19437 s4.2; Llama 3 405B's
is 16M, arXiv 2407.21783 s3.4). A batch past it is sequences given as tokens: 4,194,304 "4M
tokens" at seq 8192 is 34B tokens a step, which a search would plan as a 13-hour step."""


def add_target_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--model", required=required,
                        help=f"preset ({', '.join(list(PRESETS)[:4])}, ...), model YAML, "
                        "config.json or its folder")
    parser.add_argument("--cluster", required=required,
                        help=f"hardware profile ({', '.join(available_profiles())}) or a path")
    parser.add_argument("--num-gpus", type=count(suffixes="binary", example="64"),
                        required=required, help="GPUs in the job")
    parser.add_argument("--seq-len", type=SEQ_LEN, help=SEQ_LEN_HELP)
    parser.add_argument("--runtime", help="price the plan as this runtime runs it: "
                        f"{', '.join(('autoplan', *RUNTIMES))} or a traits YAML (default: "
                        "the runtime a --plan from search was priced for, else autoplan's own "
                        "runtime on the profile's device)")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", help="plan YAML (default: plain data parallel over all GPUs)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="edit plan fields, e.g. --set parallel.tp=8 zero_stage=1 (several "
                        "after one --set, or --set repeated, in any "
                        "order: a field given twice must get the same value; a mapping such as "
                        "parallel={tp: 2} replaces that section of --plan and merges with the "
                        "other fields --set gives in it, e.g. --set parallel.pp=4)")
    parser.add_argument("--global-batch-size", type=count(suffixes="binary", example="512"),
                        help="sequences (not tokens) per optimizer step: a 4M-token batch at seq "
                        "8192 is 512 (default: the plan's; without --plan, one micro-batch per "
                        "data-parallel rank)")
    parser.add_argument("--micro-batch-size", type=count(example="1"),
                        help="sequences per micro-batch")


def resolve_model(args: argparse.Namespace, fallback: Any = None) -> ModelSpec:
    """The model of --model (else `fallback`, a plan's) at --seq-len; a --global-batch-size
    that reads as tokens at that length is refused here, where the length is first known."""
    ref = args.model or fallback
    if ref is None:
        raise ConfigError("--model", "missing", "give --model or a plan that names one")
    seq_len = getattr(args, "seq_len", None)
    if seq_len is not None and not 0 < seq_len <= MAX_SIZE["seq_len"]:
        raise ConfigError("--seq-len", f"got {seq_len}",
                          f"expected a positive integer up to {MAX_SIZE['seq_len']:,}")
    model = load_model(ref, "--model" if args.model else "model", seq_len)  # else the plan's
    batch = getattr(args, "global_batch_size", None)
    if batch is not None:
        check_batch_tokens(batch, model.seq_len)
    return model


def check_batch_tokens(batch: int | str, seq_len: int,
                       field: str = "--global-batch-size") -> None:
    """Refuse a --global-batch-size (one size, or search's `A..B`; or the plan's `field` as
    --set or --plan gave it) whose largest size holds more than MAX_BATCH_TOKENS tokens at
    `seq_len`, naming the tokens it makes and the sequences the user likely meant."""
    from autoplan.search.ranges import parse_batch_sizes

    low, high = parse_batch_sizes(str(batch)) if isinstance(batch, str) else (batch, batch)
    if high * seq_len <= MAX_BATCH_TOKENS:
        return
    most = MAX_BATCH_TOKENS // seq_len
    given = (f"{high:,} sequences" if low == high
             else f"{low:,}..{high:,} reaches {high:,} sequences")
    problem = (f"{given} x {seq_len:,} tokens = {count_text(high * seq_len)} tokens a step, "
               f"over {count_text(MAX_BATCH_TOKENS)}: 4x the largest published batch "
               "(DeepSeek-V3's 63M tokens)")
    fix = f"it counts sequences: give at most {most:,} at seq {seq_len:,}"
    if low // seq_len >= 16:  # read as tokens, each size is a batch some run has used
        fix = "it counts sequences: " + (
            f"a {_tokens(high)}-token batch is {_sequences(high, seq_len)}" if low == high
            else f"{_tokens(low)}..{_tokens(high)} tokens is {max(low // seq_len, 1)}.."
                 f"{high // seq_len}")
    raise ConfigError(field, problem, fix)


def _tokens(n: int) -> str:
    """Whole below 1M (131,072: display.count's 131k misreads a binary 128k), else 4.19M."""
    return count_text(n) if n >= 1_000_000 else f"{n:,}"


def _sequences(tokens: int, seq_len: int) -> str:
    """`tokens` as sequences of seq_len: exact where it divides, else the nearest (about)."""
    whole_, rest = divmod(tokens, seq_len)
    return f"{whole_:,}" if not rest else f"about {max(round(tokens / seq_len), 1):,}"


def plan_from_args(args: argparse.Namespace) -> tuple[Plan, ModelSpec, ClusterSpec]:
    """The plan named by --plan (or a data-parallel default), with flags and --set applied."""
    data: dict[str, Any]
    if args.plan is not None and not args.plan.strip():
        raise ConfigError("--plan", "got an empty path", "give a plan YAML, or leave --plan out")
    if args.plan:
        raw = read_yaml(args.plan, "--plan")
        if not isinstance(raw, dict):
            raise ConfigError("--plan", f"{show(args.plan)} is not a mapping of plan fields")
        _check_plan_keys(args.plan, raw)
        data = plan_file_paths(raw, args.plan)  # its paths from its folder, as train reads it
    else:
        if args.num_gpus is None:
            raise ConfigError("--num-gpus", "missing", "give --num-gpus or --plan")
        data = {"parallel": {"dp": args.num_gpus}}
    if "cluster" in data and not isinstance(data["cluster"], dict):
        raise ConfigError("cluster", f"got {show(data['cluster'])}",
                          "expected a mapping: {profile: NAME, num_gpus: N}")
    cluster_ref = dict(data.get("cluster") or {})
    if args.cluster:
        cluster_ref["profile"] = args.cluster
    if args.num_gpus is not None:
        cluster_ref["num_gpus"] = args.num_gpus
    data["cluster"] = cluster_ref
    if args.model:
        data["model"] = args.model
    if args.plan and "batch" in data and not isinstance(data["batch"], dict):
        raise ConfigError("batch", f"got {show(data['batch'])}",
                          "expected a mapping: {micro_batch_size: M, global_batch_size: G}")
    batch = dict(data.get("batch") or {})
    if args.global_batch_size is not None:
        batch["global_batch_size"] = args.global_batch_size
    if args.micro_batch_size is not None:
        batch["micro_batch_size"] = args.micro_batch_size
    if not args.plan:  # the data-parallel default plan: one sequence per rank unless told
        batch.setdefault("micro_batch_size", 1)
    data["batch"] = batch
    derive = _dp_follows(args)
    planned_dp = None
    if derive and isinstance(data.get("parallel"), dict):
        planned_dp = data["parallel"].get("dp")
        data["parallel"] = {k: v for k, v in data["parallel"].items() if k != "dp"}
    apply_sets(data, args.set)
    _check_agree(args, data)
    if derive:
        _derive_dp(data)
        _say_dp_moved(planned_dp, data, from_file=bool(args.plan))
    if not args.plan and "precision" not in data and isinstance(data.get("cluster"), dict):
        data["precision"] = _default_precision(data["cluster"].get("profile"))
    if not args.plan and "attention" not in data and isinstance(data.get("cluster"), dict):
        data["attention"] = _default_attention(data["cluster"].get("profile"),
                                               getattr(args, "runtime", None))
    if not args.plan and "global_batch_size" not in data["batch"]:
        dp = data.get("parallel", {}).get("dp", 1) if isinstance(data.get("parallel"), dict) else 1
        mbs = data["batch"].get("micro_batch_size", 1)
        if isinstance(dp, int) and isinstance(mbs, int):
            data["batch"]["global_batch_size"] = mbs * dp
    for section in ("cluster", "batch"):
        if not isinstance(data.get(section), dict):
            raise ConfigError(section, f"got {show(data.get(section))}", "expected a mapping")
    if "model" not in data:
        raise ConfigError("--model", "missing", "give --model or a plan that names one")
    check_section_keys(data["cluster"], ClusterRef, "cluster")  # `profle:` is no missing profile
    if "profile" not in data["cluster"]:
        raise ConfigError("--cluster", "missing", "give --cluster or a plan that names one")
    plan = plan_from_dict(data)
    model = resolve_model(args, plan.model)
    if args.global_batch_size is None:  # the flag's value was checked as it was resolved
        check_batch_tokens(plan.batch.global_batch_size, model.seq_len,
                           "batch.global_batch_size")
    if getattr(args, "seq_len", None):
        plan = plan.replace(model=model)
    profile = load_profile(plan.cluster.profile, "--cluster" if args.cluster else "cluster.profile")
    return plan, model, ClusterSpec(profile, plan.cluster.num_gpus)


def _check_plan_keys(path: str, raw: dict[str, Any]) -> None:
    """A file that is no plan is named as what it is before any field it lacks is (a search's
    top.yaml, a run record: both hold plans, under `plans:` and `plan:`), and unknown keys
    before missing ones."""
    if isinstance(raw.get("plans"), list):
        raise ConfigError("--plan", f"{show(path)} is a list of {len(raw['plans'])} plans "
                          "(a search's top.yaml)", "pass one plan: the plan.yaml beside it holds "
                          "the winner")
    if isinstance(raw.get("plan"), dict) and "measured" in raw:
        raise ConfigError("--plan", f"{show(path)} is a run record, whose plan is under `plan:`",
                          "pass the plan.yaml the run was started from")
    check_plan_keys(raw)  # the loader's own list and message, before the flags add fields


def _default_precision(profile_ref: Any) -> str:
    """The precision of the default plan on this profile, as the search settles `precision:
    auto` (search_space.device_precision); a bad reference is left for the plan loader to
    name."""
    if not isinstance(profile_ref, str) or not profile_ref:
        return "bf16"
    profile = load_profile(profile_ref)
    return device_precision(profile.device.peak_flops_per_s, profile.is_cpu)


def _default_attention(profile_ref: Any, runtime: str | None) -> str:
    """The attention of the default plan, as the search settles `attention: auto`: flash where
    the runtime runs a fused kernel on the profile's device (kernel_rules.fused_attention_on:
    not Transformer Engine on a V100, not Megatron-LM's 2021 code), else eager. A bad reference
    is left for the loaders to name."""
    if not runtime or not isinstance(profile_ref, str) or not profile_ref:
        return "flash"  # autoplan's own runtime: SDPA's fused kernels run everywhere
    from autoplan.cost.kernel_rules import fused_attention_on
    from autoplan.cost.runtimes import load_runtime

    profile = load_profile(profile_ref)
    traits = load_runtime(runtime, on_cpu=profile.is_cpu)
    return "flash" if fused_attention_on(traits, profile.device) else "eager"


FLAG_FIELDS = {"--model": ("model",), "--cluster": ("cluster", "profile"),
               "--num-gpus": ("cluster", "num_gpus"),
               "--global-batch-size": ("batch", "global_batch_size"),
               "--micro-batch-size": ("batch", "micro_batch_size")}
"""The plan field each flag sets; `--set` on the same field must agree with the flag."""


def _check_agree(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Refuse a flag and a `--set` that give one field two values (which would win is a
    guess); a plan file's value is a default either may replace."""
    keys = _set_keys(args)
    for flag, path in FLAG_FIELDS.items():
        given = getattr(args, flag[2:].replace("-", "_"), None)
        if given is None or not any(".".join(path[:n]) in keys for n in range(1, 3)):
            continue
        node: Any = data
        for part in path[:-1]:
            node = node.get(part)
            if not isinstance(node, dict):
                break  # `--set cluster=7`: the strict loader names what is wrong
        else:
            node = node.get(path[-1])
            if node == given and type(node) is type(given):
                continue
            setting = ".".join(path)
            raise ConfigError(flag, f"got {show(given)} but --set {setting}={show(node)}",
                              "drop one, or give them the same value")


def _set_keys(args: argparse.Namespace) -> set[str]:
    return {a.partition("=")[0].strip() for a in args.set}


def _dp_follows(args: argparse.Namespace) -> bool:
    """dp follows from the GPU count unless the user sets it: always without a plan file, and
    with one when the command line changes the GPU count or another degree."""
    keys = _set_keys(args)
    if "parallel.dp" in keys or _sets_parallel_with_dp(args):
        return False
    changes_world = args.num_gpus is not None or "cluster.num_gpus" in keys or bool(
        keys & {"parallel", "parallel.tp", "parallel.pp", "parallel.cp"})
    return not args.plan or changes_world


def _sets_parallel_with_dp(args: argparse.Namespace) -> bool:
    """Whether a whole `--set parallel=...` gives dp (`parallel={tp: 2}` leaves it to follow
    from the GPU count, as `parallel.tp=2` does); a value that is not a mapping is left for
    the strict loader to name."""
    for assignment in args.set:
        key, _, raw = assignment.partition("=")
        if key.strip() == "parallel":
            value = safe_load_text(raw, "--set parallel", invalid_as_text=True) if raw else None
            if not isinstance(value, dict) or "dp" in value:  # mappings merge: any may give it
                return True
    return False


def _derive_dp(data: dict[str, Any]) -> None:
    """Set parallel.dp = num_gpus / (tp * pp * cp); exit 2 naming the values if it is not whole."""
    par = data.setdefault("parallel", {})
    gpus = data["cluster"].get("num_gpus") if isinstance(data.get("cluster"), dict) else None
    if not isinstance(par, dict) or not isinstance(gpus, int) or isinstance(gpus, bool):
        return  # the strict loader names what is wrong
    degrees = {k: par.get(k, 1) for k in ("tp", "pp", "cp")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in degrees.values()) or gpus <= 0:
        return
    model_parallel = degrees["tp"] * degrees["pp"] * degrees["cp"]
    if gpus % model_parallel:
        raise ConfigError(
            "parallel", f"tp={degrees['tp']} pp={degrees['pp']} cp={degrees['cp']} multiply to "
            f"{model_parallel}, which does not divide num_gpus={gpus}",
            f"choose degrees whose product divides {gpus}, or set parallel.dp and num_gpus")
    par["dp"] = gpus // model_parallel


def _say_dp_moved(planned: Any, data: dict[str, Any], from_file: bool) -> None:
    """One line when the plan's dp is refitted to another GPU count or degrees (a plan of dp 4
    on 16 GPUs is dp 2 on 8): which degree moved, from what to what, and why. A warning where
    the dp was the plan file's (the numbers are of another plan than the file), an info line
    where it was the default plan's, all data parallel (`--set parallel.tp=2` on the default
    plan refits dp as the README documents)."""
    par, cluster = data.get("parallel"), data.get("cluster")
    if not isinstance(par, dict) or not isinstance(cluster, dict) or planned is None \
            or par.get("dp") in (None, planned):
        return
    degrees = " x ".join(f"{k} {par.get(k, 1)}" for k in ("tp", "pp", "cp"))
    log.log(logging.WARNING if from_file else logging.INFO,
            "dp %s -> %s: the plan's dp, refitted to num_gpus %s at %s", show(planned),
            par["dp"], cluster.get("num_gpus"), degrees)


__all__ = ["add_plan_arguments", "add_target_arguments", "plan_from_args", "plan_to_dict"]
