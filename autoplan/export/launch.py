"""torchrun command lines shared by the torchrun, SLURM and Kubernetes targets.

The launched program is `autoplan train PLAN` (the built-in runtime reads every plan field); under
torchrun it runs in place, one process per GPU (per CPU rank, on gloo, for a CPU profile's plan).
Scheduler specifics stay in their own modules.
"""

from __future__ import annotations

import math
import re
import shlex
import textwrap
from dataclasses import dataclass, fields

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, Layout
from autoplan.export.job_inputs import NamedFile, check_data, shown
from autoplan.export.nodes import written_cluster
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan

JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Job names every scheduler target takes as they are: letters, digits, '.', '_', '-' (no shell
metacharacters, no '%' that SLURM's --output expands, no '/' in the file named after the job)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_job_name(name: str) -> None:
    """Refuse a job name outside JOB_NAME (it is written into scripts and file names)."""
    if not JOB_NAME.fullmatch(name):
        raise ConfigError(
            "--job-name", f"got {name[:80]!r}",
            "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )


def check_path_word(flag: str, value: str) -> None:
    """Refuse control characters (a line break would end the script's line) in a path."""
    if _CONTROL.search(value) or not value:
        raise ConfigError(flag, f"got {value[:80]!r}", "give a path without control characters")


LAUNCH_TARGETS = ("torchrun", "slurm", "kubernetes")
"""Targets that launch `autoplan train PLAN` under torchrun (the options of LaunchOptions)."""
ELASTIC_TARGETS = ("slurm", "kubernetes")
"""Targets that write an elastic job (`--elastic`): torchrun --nnodes=MIN:MAX running `autoplan
train --elastic`, under a scheduler that keeps the job when a node leaves."""
TRAIN_STEPS = 20
"""`autoplan train --steps`'s default (autoplan.runtime.cli; a test holds the two together)."""
CHECKPOINT_EVERY = 100
"""Steps between checkpoints of an exported job: a restart (--max-restarts, a lost node under
--elastic, a requeue) resumes at most this many steps back."""
ELASTIC_ENV = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
"""Set for elastic torchrun (autoplan.runtime.launch.ELASTIC_ENV says why)."""
RESTARTS = 3
"""torchrun --max-restarts of a LAUNCH_TARGETS export when --max-restarts is not given."""
SAVE_MARGIN_S = 120
"""Seconds the stop lead allows for the checkpoint save after the step: the cost model prices
no save (how fast the shared storage writes is no profile fact)."""
UNPRICED_STEP_S = 480
"""The step the stop lead allows where the plan cannot be priced here (another site's profile
and no step predicted in the plan): a guess, and the job's header says so."""
SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""Seconds torchrun waits, after it passes a SIGTERM on to its ranks, before it SIGKILLs them
(30 by default; the environment form of torchrun --shutdown-timeout, pytorch/pytorch#172596).
A torchrun from before that change (the package allows torch>=2.6) ignores it and waits 30 s:
the SLURM and Kubernetes headers say so."""


def max_restarts(opts: ExportOptions) -> int:
    """torchrun --max-restarts of a launcher export: the given count, else RESTARTS."""
    return RESTARTS if opts.max_restarts is None else opts.max_restarts


@dataclass(frozen=True)
class LaunchOptions(ExportOptions):
    """ExportOptions plus how the launched `autoplan train` runs (torchrun, slurm, kubernetes);
    the fields mirror train's flags of the same names."""

    steps: int = TRAIN_STEPS
    """train --steps: optimizer steps the job runs in total (a resumed job counts on)."""
    checkpoint_every: int = CHECKPOINT_EVERY
    """train --checkpoint-every: save every K steps (0: only on SIGTERM and at the end)."""
    keep_checkpoints: int | None = None
    """train --keep-checkpoints: keep the newest K (0: all); None leaves train's default."""
    plan_sha256: str | None = None
    """SHA-256 of the plan file as exported (and priced): the torchrun and SLURM scripts check
    it before they launch, so a plan file replaced since (a `search --force`, an edit) is not
    trained under the exported job's name. None: no check (a plan not read from a file)."""
    named_files: tuple[NamedFile, ...] = ()
    """The model and profile files the plan names by path, hashed as exported: checked with the
    plan (job_inputs.named_files), at the absolute paths the job reads them from, whatever
    folder it runs in."""
    data: str | None = None
    """train --data: the text the job trains on (a path as the job's ranks see it); None:
    synthetic tokens."""
    pvc: str | None = None
    """Kubernetes: the PersistentVolumeClaim mounted at the checkpoint folder in every pod;
    None: no volume there (the manifest's header names the path to mount)."""
    data_pvc: str | None = None
    """Kubernetes: the PersistentVolumeClaim mounted read-only at the folder of --data."""
    train_tokens: float | None = None
    """--train-tokens the job's --steps were derived from (job_length.steps_for_tokens), for
    the torchrun and SLURM headers; None: the steps were given as such."""
    requeue: bool = False
    """SLURM: a job whose ranks stopped short of --steps after a clean save requeues itself
    (`scontrol requeue`), so it resumes when it runs again and ends COMPLETED only once every
    step is trained (the pattern of submitit and PyTorch Lightning's SLURM auto-requeue)."""


def launch_options(opts: ExportOptions) -> LaunchOptions:
    """`opts` as LaunchOptions: train's settings at their defaults where none were given."""
    if isinstance(opts, LaunchOptions):
        return opts
    return LaunchOptions(**{f.name: getattr(opts, f.name) for f in fields(ExportOptions)})


def check_train_run(opts: ExportOptions) -> None:
    """Refuse a training length or checkpoint cadence `autoplan train` would refuse."""
    run = launch_options(opts)
    if run.steps < 1:
        raise ConfigError("--steps", f"got {run.steps}", "expected at least 1 optimizer step")
    for flag, value in (("--checkpoint-every", run.checkpoint_every),
                        ("--keep-checkpoints", run.keep_checkpoints)):
        if value is not None and value < 0:
            raise ConfigError(flag, f"got {value}", "expected 0 or more (see autoplan train "
                              "--help)")


def check_train_data(opts: ExportOptions, model: ModelSpec, *, in_pod: bool = False) -> None:
    """Refuse a --data `autoplan train` would refuse (job_inputs.check_data); `in_pod`: a path
    in a Kubernetes pod, which this machine cannot read."""
    data = launch_options(opts).data
    if data is not None:
        check_path_word("--data", data)
        check_data(data, model, in_pod=in_pod)


def on_cpu(plan: Plan) -> bool:
    """Whether the plan's profile describes a CPU host (calibrate.device_model: `cpu`), whose
    ranks are CPU processes on gloo. A profile this machine cannot load (another site's) is
    taken for GPUs, as before."""
    from autoplan.calibrate import device_model
    from autoplan.hardware import load_profile

    try:
        profile = load_profile(plan.cluster.profile)
    except ConfigError:
        return False
    return device_model(profile) == "cpu"


def runtime_reasons(plan: Plan, model: ModelSpec) -> list[str]:
    """What `autoplan train` refuses of a plan its plan rules accept: the rules of autoplan's
    runtime on the plan's kind of device (cost/runtime_rules.refusals of the autoplan-cpu or
    autoplan-cuda traits, the call runtime/validation.runtime_problems makes), so a launcher
    export writes no job its `autoplan train` would refuse."""
    from autoplan.cost.runtime_rules import refusals
    from autoplan.cost.runtimes import load_runtime

    return refusals(plan, load_runtime("autoplan", on_cpu=on_cpu(plan)), model)


def cuda_only_reasons(plan: Plan, tool: str) -> list[str]:
    """Why `tool` (a sentence on what it runs on) cannot run a CPU profile's plan."""
    if not on_cpu(plan):
        return []
    launchers = f"{', '.join(LAUNCH_TARGETS[:-1])} or {LAUNCH_TARGETS[-1]}"
    return [f"cluster.profile {plan.cluster.profile} is a CPU host: {tool}; export --to "
            f"{launchers}, whose `autoplan train` runs CPU ranks on gloo"]


def check_min_nodes(opts: ExportOptions, lay: Layout | None = None) -> None:
    """--min-nodes is the floor of an elastic job, from 1 to the plan's nodes (`lay`): a value
    outside that is a mistake in the command (exit 2), not something the plan cannot express."""
    if not opts.elastic:
        if opts.min_nodes != 1:
            raise ConfigError("--min-nodes", f"got {opts.min_nodes} without --elastic",
                              "add --elastic, or drop --min-nodes")
        return
    if lay is not None and not 1 <= opts.min_nodes <= lay.num_nodes:
        raise ConfigError("--min-nodes", f"got {opts.min_nodes}, but the plan runs on "
                          f"{lay.num_nodes} node(s)", f"give 1 to {lay.num_nodes}")


def train_argv(opts: ExportOptions, plan_path: str | None = None,
               lay: Layout | None = None, *, cpu: bool = False) -> list[str]:
    """`autoplan train PLAN --steps N [--data D] --checkpoint-dir D --checkpoint-every K
    --resume` (resume picks up after a restart); `--keep-checkpoints` when given; a CPU plan:
    `--backend gloo` (train's auto picks NCCL wherever CUDA is visible); elastic: `--elastic
    --min-gpus N` as well (`lay` gives N)."""
    run = launch_options(opts)
    argv = [
        "autoplan",
        "train",
        plan_path or opts.plan_path,
        "--steps",
        str(run.steps),
        *(["--data", run.data] if run.data is not None else []),
        "--checkpoint-dir",
        opts.checkpoint_dir,
        "--checkpoint-every",
        str(run.checkpoint_every),
    ]
    if run.keep_checkpoints is not None:
        argv += ["--keep-checkpoints", str(run.keep_checkpoints)]
    argv.append("--resume")
    if cpu:
        argv += ["--backend", "gloo"]
    if opts.elastic:
        argv.append("--elastic")
        if lay is not None:
            argv += ["--min-gpus", str(opts.min_nodes * lay.nproc_per_node)]
    return argv


def torchrun_argv(
    lay: Layout, opts: ExportOptions, *, rdzv_host: str | None, rdzv_id: str | None
) -> list[str]:
    """torchrun options: standalone on one node, c10d rendezvous at `rdzv_host` otherwise;
    elastic: `--nnodes=MIN:MAX` (PyTorch's elastic quickstart, docs.pytorch.org/docs/stable/
    elastic/quickstart.html: run it on MIN to MAX nodes; a lost node is a scale-down event that
    --max-restarts counts).

    `rdzv_host`/`rdzv_id` may be shell expressions (e.g. "$head_node"); callers quote them.
    """
    nodes = f"{opts.min_nodes}:{lay.num_nodes}" if opts.elastic else str(lay.num_nodes)
    argv = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={lay.nproc_per_node}"]
    if lay.num_nodes == 1 and rdzv_host is None:
        argv.append("--standalone")
    else:
        argv += [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_host}:{opts.rdzv_port}",
            f"--rdzv-id={rdzv_id or opts.job_name}",
        ]
    argv += [f"--max-restarts={max_restarts(opts)}", "--no-python"]
    return argv


def data_lines(opts: ExportOptions, where: str) -> list[str]:
    """A comment on what the job trains on: --data's text, read by every rank (`where` says
    where it must lie), or synthetic tokens when no --data was given."""
    run = launch_options(opts)
    if run.data is None:
        return ["# no --data: `autoplan train` trains on synthetic tokens (export --data PATH "
                "for a text corpus)."]
    return [f"# data: {run.data} (byte-level text), read by every rank {where}."]


def checkpoint_lines(opts: ExportOptions, num_nodes: int, note: str = "") -> list[str]:
    """A comment on the checkpoint folder (which `autoplan export` makes absolute for the
    torchrun and SLURM jobs): every rank writes its shard there and all of them are read back
    on resume (torch.distributed.checkpoint), so on several nodes it must be storage every node
    reads and writes. `note`: more on the path, in the same parentheses."""
    said = ["absolute, as export resolved it"] if opts.checkpoint_dir.startswith("/") else []
    said += [note] if note else []
    text = f"checkpoints: {shown(opts.checkpoint_dir)}" + (f" ({'; '.join(said)})" if said
                                                          else "")
    if num_nodes == 1:
        return comment(text + ", read back on --resume.")
    return comment(f"{text}: every rank writes its shard there and reads them all back on "
                   f"resume, so it must be on storage all {num_nodes} nodes read and write "
                   "(a shared filesystem), not a node's local disk.")


def plural(n: int, word: str) -> str:
    """`word` for `n` of it: "1 step", "2 steps" (the number is the caller's)."""
    return word if n == 1 else word + "s"


def all_steps(n: int) -> str:
    """"all 20 steps", "the 1 step": every step of a run of `n`, for a header or a log line."""
    return "the 1 step" if n == 1 else f"all {n} steps"


def comment(text: str, width: int = 100) -> list[str]:
    """`text` as '# ' comment lines of at most `width` characters (a long word, e.g. a path,
    stays whole, and so does a number with its unit)."""
    glued = _NUMBER_UNIT.sub("\\1\xa0\\2", text)
    return [line.replace("\xa0", " ") for line in textwrap.wrap(
        glued, width, initial_indent="# ", subsequent_indent="# ", break_long_words=False,
        break_on_hyphens=False)]


_NUMBER_UNIT = re.compile(r"(\d) (s|GiB)\b")


def shell_join(argv: list[str], *, keep: tuple[str, ...] = ()) -> str:
    """Quote for bash, leaving words that contain one of `keep` (shell expansions) in "..."."""
    words = []
    for word in argv:
        if any(k in word for k in keep):
            words.append('"' + word.replace('"', '\\"') + '"')
        else:
            words.append(shlex.quote(word))
    return " ".join(words)


def continued(lines: list[str], indent: str = "  ") -> str:
    """Join shell lines with backslash continuations, one option per line."""
    return (" \\\n" + indent).join(lines)


@dataclass(frozen=True)
class StopLead:
    """How long autoplan's ranks need between SIGTERM and SIGKILL, and how that was sized: they
    stop at the end of the step in progress and save a checkpoint (runtime/worker.py), so one
    step and a save. The SLURM job asks for SIGTERM that long before its time limit (#SBATCH
    --signal), every Kubernetes pod gets that long to terminate (terminationGracePeriodSeconds),
    and both give torchrun that long before it kills its ranks (SHUTDOWN_ENV)."""

    seconds_s: int
    step_s: float | None
    """One step as priced; None: not priced here."""
    band: float
    """The price's error band (0.12: +-12%); the lead allows for its upper edge."""
    priced_by: str
    """Where step_s comes from, for the header's comment."""

    def sized_as(self) -> str:
        """How seconds_s was sized, for a header's comment."""
        if self.step_s is None:
            step = (f"a guessed {UNPRICED_STEP_S} s for one step (no price here: the plan's "
                    "profile does not load and the plan holds no predicted step)")
        else:
            step = f"one step, {self.step_s:.3g} s + {self.band:.0%} {self.priced_by},"
        return f"{step} plus {SAVE_MARGIN_S} s for the save, which autoplan does not price"


def stop_lead(plan: Plan, model: ModelSpec, gpus_per_node: int) -> StopLead:
    """The stop lead: one step as the job runs it (autoplan's runtime on nodes of
    `gpus_per_node`, at the upper edge of the error band), plus SAVE_MARGIN_S for the save;
    the plan's predicted step where its profile does not load here, else UNPRICED_STEP_S."""
    from autoplan.cost.estimate import estimate_plan

    step: float | None
    try:
        est = estimate_plan(plan, written_cluster(plan, gpus_per_node), model=model)
        step, band, by = est.step_time_s, est.error_band, f"as priced for {est.runtime}"
    except ConfigError:  # another site's profile: what the search that wrote the plan said
        predicted = plan.predicted or {}
        step, band = predicted.get("step_time_s"), predicted.get("error_band") or 0.0
        by = "as the plan's search predicted"
    if not isinstance(step, int | float) or not math.isfinite(step) or step <= 0:
        step, band, by = None, 0.0, ""
    if not isinstance(band, int | float) or not math.isfinite(band) or band < 0:
        band = 0.0
    allowed = UNPRICED_STEP_S if step is None else step * (1.0 + band)
    return StopLead(math.ceil(allowed) + SAVE_MARGIN_S, step, float(band), by)
