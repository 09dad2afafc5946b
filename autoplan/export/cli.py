"""`autoplan export PLAN --to TARGET` and `autoplan import FILE --from deepspeed|megatron`.

Export prints to stdout, or writes --out (never over an existing file without --force, never
over the plan); a plan the target cannot express, or an option it does not write, is refused
with exit code 2 and nothing is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from autoplan import fileset, fsutil
from autoplan.cli_common import BINARY_NOTE, DECIMAL_NOTE, add_format_argument, amount, count
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.job_inputs import PLAN_FILE_TARGETS, named_files
from autoplan.export.job_length import overshoot_warning, steps_for_tokens, written_time
from autoplan.export.launch import (
    CHECKPOINT_EVERY,
    LAUNCH_TARGETS,
    RESTARTS,
    TRAIN_STEPS,
    LaunchOptions,
)
from autoplan.export.nodes import bigger_node_warning, split_warning, written_cluster
from autoplan.export.option_checks import (
    MAX_RESTARTS,
    check_options,
    check_out,
    check_words,
    gpus_per_node,
)
from autoplan.export.pricing import check_fits, price_for_target, target_runtime
from autoplan.export.registry import TARGET_NAMES, get_target
from autoplan.export.slurm import SlurmOptions
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS, load_model
from autoplan.plan import Plan
from autoplan.plan_files import plan_model_ref
from autoplan.plan_sets import apply_sets
from autoplan.yaml_io import dump_yaml

log = logging.getLogger(__name__)
_LAUNCHERS = "/".join(LAUNCH_TARGETS)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="write a plan in another tool's format")
    p.add_argument("plan", metavar="PLAN", help="plan YAML")
    p.add_argument("--to", required=True, choices=TARGET_NAMES, help="target format")
    p.add_argument("--out", help="write here instead of stdout (extra files go beside it)")
    p.add_argument("--force", action="store_true", help="replace existing output files")
    p.add_argument("--gpus-per-node", type=count(example="8"),
                   help="default: the plan's hardware profile")
    p.add_argument("--checkpoint-dir", help=f"{_LAUNCHERS}: `autoplan train --checkpoint-dir` "
                   f"(default {ExportOptions.checkpoint_dir}; torchrun/slurm write it absolute, "
                   "from where export runs; kubernetes: a path in the pod)")
    p.add_argument("--data", metavar="PATH",
                   help=f"{_LAUNCHERS}: `autoplan train --data`, the text the job trains on "
                        "(default: synthetic tokens); torchrun/slurm: checked here and written "
                        "absolute; kubernetes: an absolute path inside the pod")
    p.add_argument("--max-restarts", type=count(low=0, high=MAX_RESTARTS, example="3"),
                   help=f"{_LAUNCHERS}, megatron: torchrun --max-restarts (default {RESTARTS}; "
                        "megatron: torchrun's, 0)")
    p.add_argument("--steps", type=count(suffixes="decimal", example="20 or 10k"),
                   help=f"{_LAUNCHERS}: `autoplan train --steps`, optimizer steps the job runs in "
                        f"total, counted on after a resume (default {TRAIN_STEPS}, train's; "
                        f"{DECIMAL_NOTE})")
    p.add_argument("--train-tokens", type=amount("tokens", "1e12 or 1T"), metavar="N",
                   help="slurm, torchrun: the training length in tokens instead of --steps: "
                        "--steps = N / (the plan's global batch x seq_len), rounded up, said in "
                        f"the header ({DECIMAL_NOTE})")
    p.add_argument("--time-limit", metavar="TIME",
                   help="slurm: #SBATCH --time, the most the job may run (D-HH:MM:SS, HH:MM:SS "
                        "or minutes): a job priced longer is refused unless --requeue, which "
                        "runs it in turns, checked against --steps at the priced step's upper "
                        "edge, the saves, 10 min of start-up and the --signal lead (default, or "
                        "none: no --time, the partition's limit applies; the header advises the "
                        "priced run)")
    p.add_argument("--checkpoint-every", type=count(low=0, suffixes="decimal",
                                                     example="500 or 1k"), metavar="K",
                   help=f"{_LAUNCHERS}: `autoplan train --checkpoint-every`, save every K steps, "
                        f"so a restart resumes at most K steps back (default {CHECKPOINT_EVERY}; "
                        "0: only on SIGTERM and at the end)")
    p.add_argument("--keep-checkpoints", type=count(low=0, example="3"), metavar="K",
                   help=f"{_LAUNCHERS}: `autoplan train --keep-checkpoints`, keep the newest K "
                        "(default: train's, 3; 0: keep all)")
    p.add_argument("--job-name", help=f"{_LAUNCHERS}, megatron: scheduler job / object name, "
                   f"rendezvous id (default {ExportOptions.job_name})")
    p.add_argument("--image", help="container image (kubernetes; default autoplan:latest)")
    p.add_argument("--namespace", help="Kubernetes namespace")
    p.add_argument("--pvc", metavar="CLAIM",
                   help="kubernetes: PersistentVolumeClaim mounted at --checkpoint-dir (absolute) "
                        "in every pod; ReadWriteMany for several nodes")
    p.add_argument("--requeue", action="store_true", default=None,
                   help="slurm: a job stopped short of --steps after a clean save (the "
                        "time-limit warning) requeues itself and resumes when it runs again")
    p.add_argument("--data-pvc", metavar="CLAIM",
                   help="kubernetes: PersistentVolumeClaim mounted read-only at the folder of "
                        "--data in every pod (the claim holds the text at its root)")
    p.add_argument(
        "--kind",
        choices=("trainjob", "pytorchjob", "jobset"),
        help="Kubernetes resource (default: Kubeflow Trainer v2 TrainJob)",
    )
    p.add_argument(
        "--torchtitan-format",
        choices=("python", "toml"),
        help="python: config_registry (torchtitan >= 0.3); toml: <= 0.2.2 (default: toml when "
             "--out ends in .toml, else python)",
    )
    p.add_argument("--script", help="training script in the deepspeed/megatron launch command")
    p.add_argument("--elastic", action="store_true", help="slurm/kubernetes: torchrun "
                   "--nnodes=MIN:MAX; `autoplan train --elastic` re-plans when nodes leave or join")
    p.add_argument("--min-nodes", type=count(example="2"),
                   help="with --elastic: fewest nodes (default 1)")
    p.add_argument("--no-memory-check", action="store_true",
                   help="write it even when the cost model says the plan does not fit as the "
                   "target runs it (by default refused, exit 3, as `autoplan train` refuses it)")
    add_format_argument(p, "json or yaml: the {target, files} wrapper (default: the target's "
                           "own files)")
    p.set_defaults(func=run_export)

    q = subparsers.add_parser("import", help="read a DeepSpeed or Megatron config into a plan")
    q.add_argument("file", metavar="FILE", help="DeepSpeed JSON, or Megatron arguments / script")
    q.add_argument("--from", dest="source", required=True, choices=("deepspeed", "megatron"))
    q.add_argument("--model", help="model preset or spec (required for DeepSpeed)")
    q.add_argument("--cluster", required=True, help="hardware profile name or path")
    q.add_argument("--num-gpus", type=count(suffixes="binary", example="64"),
                   help=f"GPUs in the job (default: from the config; {BINARY_NOTE})")
    q.add_argument(
        "--set",
        action=_Assignments,
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="edit plan fields the config cannot say, e.g. --set parallel.tp=2 parallel.pp=4 "
        "(several after one --set, or --set repeated, as estimate takes them: a field given "
        "twice must get the same value)",
    )
    q.add_argument("--out", help="write the plan YAML here instead of stdout")
    q.add_argument("--force", action="store_true", help="replace an existing --out file")
    add_format_argument(q, "json: the plan as JSON (default: the plan YAML)")
    q.set_defaults(func=run_import)


class _Assignments(argparse.Action):
    """`--set` as estimate takes it (plan_args: several after one --set, or --set repeated).
    FILE typed after the assignments would be taken for one: refused naming the fix, where
    argparse would say only that FILE is missing."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        stray = [v for v in values if "=" not in v]
        if stray and getattr(namespace, "file", None) is None:
            raise argparse.ArgumentError(self, f"got {stray[0]!r}, which is no KEY=VALUE: give "
                                         "FILE before --set")
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *values])


def _out_paths(out: Path, names: list[str]) -> list[Path]:
    """The primary file at --out, the others beside it as <stem>.<name>."""
    return [out] + [out.with_name(f"{out.stem}.{name}") for name in names[1:]]


def _launch_options(args: argparse.Namespace, plan: Plan) -> LaunchOptions:
    """The options as the targets read them: each one not given at its default. A job that
    reads files where they lie (torchrun, slurm) gets them pinned: absolute paths (it runs from
    any folder: load_plan made the plan's relative paths absolute from its folder, and
    job_inputs.named_files refuses one it left as written), hashes of the plan and the files
    it names."""
    plan_file = Path(args.plan)
    in_place = args.to in PLAN_FILE_TARGETS
    named = named_files(plan, plan_file) if in_place else ()
    checkpoint_dir = (ExportOptions.checkpoint_dir if args.checkpoint_dir is None
                      else args.checkpoint_dir)
    data = args.data
    if in_place:
        checkpoint_dir = os.path.abspath(checkpoint_dir)
        data = None if data is None else os.path.abspath(data)
    steps = TRAIN_STEPS if args.steps is None else args.steps
    if args.train_tokens is not None:  # --to slurm or torchrun alone (check_options)
        steps = steps_for_tokens(plan, plan.model_spec(), args.train_tokens)
    options = SlurmOptions if args.to == "slurm" else LaunchOptions
    extra = {"time_limit": args.time_limit} if args.to == "slurm" else {}
    return options(
        **extra,
        # as exported: absolute, so the script runs from any folder, and hashed, so a plan file
        # replaced since is not trained under the exported job (job_inputs.check_lines)
        plan_path=str(plan_file.resolve()),
        plan_sha256=hashlib.sha256(plan_file.read_bytes()).hexdigest(),
        named_files=named,
        data=data,
        gpus_per_node=gpus_per_node(args, plan.cluster.profile),
        checkpoint_dir=checkpoint_dir,
        max_restarts=args.max_restarts,  # None: each target's own default
        job_name=ExportOptions.job_name if args.job_name is None else args.job_name,
        image=args.image or ExportOptions.image,
        namespace=args.namespace,
        k8s_kind=args.kind or ExportOptions.k8s_kind,
        torchtitan_format=torchtitan_format(args),
        script=args.script,
        # --format json/yaml writes the {target, files} wrapper to --out: the files are named
        # by their keys there, so the launch commands name those, not the wrapper's path
        out=None if args.format in ("json", "yaml") else args.out,
        elastic=args.elastic,
        min_nodes=1 if args.min_nodes is None else args.min_nodes,
        steps=steps,
        checkpoint_every=CHECKPOINT_EVERY if args.checkpoint_every is None
        else args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        pvc=args.pvc,
        data_pvc=args.data_pvc,
        requeue=bool(args.requeue),
        train_tokens=args.train_tokens,
    )


def torchtitan_format(args: argparse.Namespace) -> str:
    """--torchtitan-format, else the form --out's suffix asks for (job.toml: the TOML job of
    torchtitan <= 0.2.2), else Python (>= 0.3). A --format json/yaml wrapper's --out names the
    wrapper, not the job, so its suffix picks nothing."""
    if args.torchtitan_format is not None:
        return str(args.torchtitan_format)
    if args.out and args.format not in ("json", "yaml") and Path(args.out).suffix == ".toml":
        return "toml"
    return ExportOptions.torchtitan_format


def run_export(args: argparse.Namespace) -> int:
    from autoplan.plan_files import load_plan

    check_options(args)
    check_words(args)
    check_out(args.out)
    if args.out is not None:  # a directory, a path under a file, an unwritable folder: first
        fsutil.check_file_target(args.out, force=args.force, field="--out")
    plan = load_plan(args.plan)
    model = plan.model_spec()
    opts = _launch_options(args, plan)
    overshoot = overshoot_warning(opts, plan, model)
    if overshoot:
        log.warning("%s", overshoot)
    # refuses before any write, naming the search --runtime of the engine the target runs
    files = export_plan(get_target(args.to), plan, model, opts,
                        target_runtime(args.to, opts.torchtitan_format) or "autoplan")
    if not args.no_memory_check:
        check_fits(args.plan, plan, model, target_runtime(args.to, opts.torchtitan_format),
                    opts.gpus_per_node)
    names = list(files)
    if args.out is not None:
        wrapped = args.format in ("json", "yaml")
        for path in [Path(args.out)] if wrapped else _out_paths(Path(args.out), names):
            fsutil.check_not_input(path, args.plan, "the plan being exported")

    def done() -> int:  # after every file is written: a failed export prints only its error
        time_line, too_long = written_time(files)
        if time_line:
            sys.stderr.write(time_line + "\n")
        if too_long:
            log.warning("%s", too_long)
        try:  # priced on the nodes written, which --gpus-per-node may have changed
            line = price_for_target(plan, model, args.to, opts.torchtitan_format,
                                    written_cluster(plan, opts.gpus_per_node))
        except ConfigError as err:  # a profile of another machine: the export stands alone
            log.info("not priced: %s", err)
            return 0
        if args.gpus_per_node is not None:
            own = load_profile(plan.cluster.profile).gpus_per_node
            for warning in (split_warning(plan, own, opts.gpus_per_node),
                            bigger_node_warning(plan.cluster.profile, own, opts.gpus_per_node)):
                if warning:
                    log.warning("%s", warning)
        sys.stderr.write(line + "\n")
        return 0
    if args.format in ("json", "yaml"):
        data = {"target": args.to, "files": files}
        text = json.dumps(data, indent=2) + "\n" if args.format == "json" else dump_yaml(data)
        if args.out is not None:
            fsutil.write_text(args.out, text, force=args.force, field="--out")
            sys.stderr.write(f"wrote {args.out}\n")
        else:
            sys.stdout.write(text)
        return done()
    if args.out is None:
        sys.stdout.write(files[names[0]])
        for name in names[1:]:  # e.g. the deepspeed launch command: a hint, not the output
            sys.stderr.write(f"# {name}\n{files[name]}")
        return done()
    paths = _out_paths(Path(args.out), names)
    # all staged, then renamed into place: a failure (a full disk) leaves none of them
    fileset.write_texts({path: files[name] for path, name in zip(paths, names, strict=True)},
                       force=args.force, field="--out")
    for path in paths:
        sys.stderr.write(f"wrote {path}\n")
    return done()


def portable(plan: Plan) -> Plan:
    """The imported plan as search writes one: a model file's spec inline and a profile path
    made absolute, so the plan reads the same from any folder (a path as typed held only
    from the one the import ran in; an export that cds into the plan's folder refused it)."""
    from autoplan.resources import plan_profile_ref

    cluster = dataclasses.replace(plan.cluster, profile=plan_profile_ref(plan.cluster.profile))
    return plan.replace(model=plan_model_ref(plan.model, plan.model_spec()), cluster=cluster)


def run_import(args: argparse.Namespace) -> int:
    from autoplan.export.importers import IMPORTERS, files_read, launch_runtime
    from autoplan.plan_files import load_plan, plan_to_dict

    check_out(args.out)
    apply_sets({}, args.set)  # a field given twice is refused first, as estimate refuses it
    if args.model is not None and args.model not in PRESETS and not os.path.exists(args.model):
        load_model(args.model)  # an unknown name: refused as --model (not the plan's model:)
    if args.out is not None:
        fsutil.check_file_target(args.out, force=args.force, field="--out")
        fsutil.check_not_input(Path(args.out), args.file, "the file being imported")
        for read in files_read(args.source, args.file)[1:]:  # a launch's DeepSpeed JSON
            fsutil.check_not_input(Path(args.out), str(read), "a file the import reads")
    plan = IMPORTERS[args.source](
        args.file,
        model=args.model,
        cluster=args.cluster,
        num_gpus=args.num_gpus,
        assignments=args.set,
    )
    plan = portable(plan)
    if args.out is not None:  # JSON when asked (it is YAML too: load_plan reads either)
        text = (json.dumps(plan_to_dict(plan), indent=2) + "\n" if args.format == "json"
                else dump_yaml(plan_to_dict(plan)))
        fsutil.write_text(args.out, text, force=args.force, field="--out")
        if load_plan(args.out) != plan:  # every save reloads and compares (plan_files.save_plan)
            raise AssertionError(f"plan written to {args.out} does not reload equal")
        sys.stderr.write(f"wrote {args.out}\n")
        # the plan keeps no engine: estimate prices autoplan's own runtime unless told; the
        # launch's dispatcher or --tp-comm-overlap picks the preset (megatron_runtime)
        runtime, note = launch_runtime(args.source, args.file)
        sys.stderr.write(f"price it as {args.source} runs it: autoplan estimate --plan "
                         f"{shlex.quote(args.out)} --runtime {runtime}"
                         + (f" ({note})" if note else "") + "\n")
    elif args.format == "json":
        sys.stdout.write(json.dumps(plan_to_dict(plan), indent=2) + "\n")
    else:
        sys.stdout.write(dump_yaml(plan_to_dict(plan)))
    return 0

