"""`autoplan export`'s checks of its options before the plan is read: an option the target does
not write (refused, not dropped), a value a script or manifest cannot hold, an --out that names
no file; and the node size written (--gpus-per-node, else the plan's profile's)."""

from __future__ import annotations

import argparse
import os

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions
from autoplan.export.job_length import parse_time_s
from autoplan.export.launch import ELASTIC_TARGETS, LAUNCH_TARGETS, check_path_word
from autoplan.hardware import MAX_GPUS_PER_NODE, load_profile

OPTION_TARGETS = {"--image": ("kubernetes",), "--namespace": ("kubernetes",),
                  "--kind": ("kubernetes",), "--pvc": ("kubernetes",),
                  "--data-pvc": ("kubernetes",), "--requeue": ("slurm",),
                  "--train-tokens": ("slurm", "torchrun"), "--time-limit": ("slurm",),
                  "--torchtitan-format": ("torchtitan",),
                  "--script": ("deepspeed", "megatron"), "--steps": LAUNCH_TARGETS,
                  "--checkpoint-every": LAUNCH_TARGETS, "--keep-checkpoints": LAUNCH_TARGETS,
                  "--checkpoint-dir": LAUNCH_TARGETS, "--data": LAUNCH_TARGETS,
                  "--job-name": (*LAUNCH_TARGETS, "megatron"),
                  "--max-restarts": (*LAUNCH_TARGETS, "megatron"),
                  "--min-nodes": ELASTIC_TARGETS}
"""Options only some targets write; another target refuses them rather than drop them (their
defaults are None, so a given value is told from none; a target that writes one applies its
default). Megatron's script runs torchrun, which takes --max-restarts and, on several nodes,
the job name as its rendezvous id; its checkpoints are Megatron's own --save/--load."""
MAX_RESTARTS = 10_000
"""Largest --max-restarts (torchrun takes any count; a larger one is a typo)."""


def check_options(args: argparse.Namespace) -> None:
    """Refuse an option the target does not write (--elastic and --min-nodes included), rather
    than drop it; then --min-nodes without --elastic, which a target with elastic jobs takes."""
    if args.elastic and args.to not in ELASTIC_TARGETS:
        raise ConfigError("--elastic", f"--to {args.to} writes no elastic job: --elastic runs "
                          "`autoplan train --elastic` under torchrun --nnodes=MIN:MAX, which only "
                          f"--to {' and '.join(ELASTIC_TARGETS)} write",
                          f"export --to {' or '.join(ELASTIC_TARGETS)}, or drop --elastic")
    for flag, targets in OPTION_TARGETS.items():
        if getattr(args, flag[2:].replace("-", "_")) is not None and args.to not in targets:
            raise ConfigError(flag, f"--to {args.to} writes no {flag[2:]}",
                              f"drop it, or export --to {' or '.join(targets)}")
    if args.time_limit is not None:  # a bad time is refused before the plan is read
        args.time_limit = args.time_limit.strip()
        # sbatch's UNLIMITED and INFINITE: no --time of ours, the partition's limit
        if args.time_limit.lower() in ("none", "unlimited", "infinite"):
            args.time_limit = "none"
        else:
            parse_time_s(args.time_limit)
    if args.train_tokens is not None and args.steps is not None:
        raise ConfigError("--train-tokens", f"given with --steps {args.steps}",
                          "give one of them: --train-tokens is made into --steps")
    if args.min_nodes is not None and not args.elastic:  # as train's --min-gpus
        raise ConfigError("--min-nodes", f"got {args.min_nodes} without --elastic",
                          "add --elastic, or drop --min-nodes")


def check_out(out: str | None) -> None:
    """--out names the file to write: an empty one or a folder (a trailing '/', '.' or '..')
    is a mistake, not a request for stdout or for a file named after the folder."""
    if out is None:
        return
    if not out:
        raise ConfigError("--out", "got ''", "give a file path, or leave --out out to print "
                          "to stdout")
    if os.path.basename(out) in ("", ".", ".."):
        raise ConfigError("--out", f"{out[:80]!r} names a folder", "give a file path, e.g. "
                          f"{os.path.join(os.path.normpath(out), 'job.sh')}")


def check_words(args: argparse.Namespace) -> None:
    """Values written into a launch script or manifest: a control character ends the script's
    line; an empty script or an image with a space in it names nothing to run."""
    if args.script is not None:
        if not args.script.strip():
            raise ConfigError("--script", f"got {args.script!r}", "give the training "
                              "script's path, or leave --script out for the target's default")
        check_path_word("--script", args.script)
    if args.image is not None:
        if not args.image or any(c.isspace() for c in args.image):
            raise ConfigError("--image", f"got {args.image[:80]!r}", "give an image "
                              "reference without spaces, e.g. registry.example/autoplan:1.0, "
                              f"or leave --image out for {ExportOptions.image}")
        check_path_word("--image", args.image)
    for flag, value in (("--checkpoint-dir", args.checkpoint_dir), ("--data", args.data)):
        if value is not None:  # torchrun's train line too; before '' is made the folder here
            check_path_word(flag, value)


def gpus_per_node(args: argparse.Namespace, profile: str) -> int:
    """GPUs in one node of the job written: --gpus-per-node, else the plan's profile's."""
    if args.gpus_per_node is not None:
        if not 1 <= args.gpus_per_node <= MAX_GPUS_PER_NODE:  # as a profile's gpus_per_node
            raise ConfigError("--gpus-per-node", f"got {args.gpus_per_node}",
                              f"expected 1 to {MAX_GPUS_PER_NODE} GPUs in one node")
        return int(args.gpus_per_node)
    try:
        return load_profile(profile, flag="cluster.profile").gpus_per_node
    except ConfigError as err:  # the plan's profile, not a flag the user gave
        raise ConfigError("cluster.profile", err.problem, "restore the plan's profile, or give "
                          "--gpus-per-node N to write the job for another site's GPUs") from None
