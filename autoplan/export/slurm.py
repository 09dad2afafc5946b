"""`--to slurm`: an sbatch script that runs torchrun once per node with srun.

c10d rendezvous on the job's first node; nodes and GPUs per node come from the plan and the
hardware profile (a CPU profile's plan asks for CPUs: one per rank, no GPUs); torchrun restarts the worker group up to --max-restarts times and
`autoplan train --resume` continues from the checkpoint directory. `--elastic`: torchrun
`--nnodes=MIN:MAX`, a job SLURM keeps when a node fails, and `autoplan train --elastic`, which
re-plans for the nodes left, on nodes of the size written (--gpus-per-node). `--signal` warns the
ranks one priced step and a checkpoint save before the time limit (stop_warning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, ExportTarget, Layout, layout, layout_reasons
from autoplan.export.job_inputs import check_lines
from autoplan.export.launch import (
    ELASTIC_ENV,
    check_job_name,
    check_min_nodes,
    check_train_data,
    check_train_run,
    checkpoint_lines,
    comment,
    continued,
    data_lines,
    launch_options,
    on_cpu,
    runtime_reasons,
    shell_join,
    torchrun_argv,
    train_argv,
)
from autoplan.export.nodes import NODE_SIZE_ENV, written_cluster
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan

SAVE_MARGIN_S = 120
"""Seconds the time-limit warning allows for the checkpoint save after the step: the cost
model prices no save (how fast the shared storage writes is no profile fact)."""
UNPRICED_STEP_S = 480
"""The step the warning allows where the plan cannot be priced here (another site's profile
and no step predicted in the plan): a guess, and the script says so."""
SIGNAL_MAX_S = 65535
"""sbatch(1) --signal: "sig_time must have an integer value between 0 and 65535"."""
SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
"""Seconds torchrun waits, after it passes a SIGTERM on to its ranks, before it SIGKILLs them
(30 by default; the environment form of torchrun --shutdown-timeout, pytorch/pytorch#172596).
A torchrun from before that change (the package allows torch>=2.6) ignores it and waits 30 s:
the script's header says so."""


class SlurmTarget(ExportTarget):
    name = "slurm"
    summary = "sbatch script: srun + multi-node torchrun (c10d) running `autoplan train PLAN`"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        check_job_name(opts.job_name)  # it names the job, its log and the script file
        _check_sbatch_paths(opts)
        check_train_run(opts)
        check_train_data(opts, model)
        why = layout_reasons(plan, opts.gpus_per_node)
        check_min_nodes(opts, None if why else layout(plan, opts.gpus_per_node))
        return why + runtime_reasons(plan, model)

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        cpu = on_cpu(plan)
        run = launch_options(opts)
        unit = "CPU" if cpu else "GPU"
        argv = torchrun_argv(lay, opts, rdzv_host="$head_node", rdzv_id="$SLURM_JOB_ID")
        # srun --kill-on-bad-exit=0: one node's torchrun ending does not end the others'
        # (slurm.schedmd.com/srun.html); elastic ones re-rendezvous without it
        srun = ["srun", "--kill-on-bad-exit=0"] if opts.elastic else ["srun"]
        if cpu:  # srun inherits no --cpus-per-task from sbatch since Slurm 22.05 (sbatch(1))
            srun.append(f"--cpus-per-task={lay.nproc_per_node}")
        launch = [shell_join(srun, keep=("$",))]
        launch += [shell_join([w], keep=("$",)) for w in argv]
        launch.append(shell_join(train_argv(opts, lay=lay, cpu=cpu)))
        warning = stop_warning(plan, model, opts.gpus_per_node)
        text = "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name={opts.job_name}",
                f"#SBATCH --nodes={lay.num_nodes}",
                "#SBATCH --ntasks-per-node=1",
                _device_directive(lay, cpu),
                "#SBATCH --exclusive",
                *_elastic_directives(opts),
                f"#SBATCH --signal=TERM@{warning.seconds_s}",
                f"#SBATCH --output={opts.job_name}-%j.out",
                "#",
                "# Written by `autoplan export --to slurm`: one torchrun per node (srun), one process",
                f"# per {unit}; plan: dp={plan.parallel.dp} tp={plan.parallel.tp} "
                f"pp={plan.parallel.pp} cp={plan.parallel.cp} on {lay.num_nodes} x "
                f"{lay.nproc_per_node} {unit}s.",
                *checkpoint_lines(opts, lay.num_nodes, "the mkdir below runs on the first "
                                  "node only" if lay.num_nodes > 1 else ""),
                *data_lines(opts, "on every node: keep it on storage they all read"),
                *warning.comment(),
                *_elastic_comment(opts),
                "set -euo pipefail",
                *check_lines(run.plan_path, run.plan_sha256, run.named_files),
                "",
                "# The first node hosts the c10d rendezvous.",
                'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"mkdir -p {shell_join([opts.checkpoint_dir])}",
                "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
                f"export {SHUTDOWN_ENV}=${{{SHUTDOWN_ENV}:-{warning.seconds_s}}}",
                *(elastic_env_lines(opts) if opts.elastic else []),
                "",
                continued(launch),
                "",
            ]
        )
        return {f"{opts.job_name}.sbatch": text}


def _check_sbatch_paths(opts: ExportOptions) -> None:
    """The paths the script writes are quoted words, a line break inside one included (the
    plan's folder may hold one: job_inputs.check_lines); but sbatch refuses a script holding
    a carriage return before a line break, as DOS line breaks."""
    run = launch_options(opts)
    written = [("PLAN", run.plan_path), ("--checkpoint-dir", run.checkpoint_dir),
               *((named.field, named.path) for named in run.named_files)]
    for field, path in written:
        if "\r\n" in path:
            raise ConfigError(field, f"{path!r} holds a carriage return and a line break, "
                              "which sbatch refuses in a script (DOS line breaks)",
                              "rename the folder or file, or export --to torchrun")


def _device_directive(lay: Layout, cpu: bool) -> str:
    """GPUs per node; a CPU plan: one CPU per rank for the node's one task (torchrun), which
    a CPU-only partition grants and a GPU request would be refused on."""
    if cpu:
        return f"#SBATCH --cpus-per-task={lay.nproc_per_node}"
    return f"#SBATCH --gpus-per-node={lay.nproc_per_node}"


def elastic_env_lines(opts: ExportOptions) -> list[str]:
    """The elastic job's environment: torchrun's store setting (ELASTIC_ENV) and the node size
    written, which `autoplan train --elastic` re-plans on (nodes.NODE_SIZE_ENV)."""
    return [f"export {ELASTIC_ENV[0]}={ELASTIC_ENV[1]}",
            f"export {NODE_SIZE_ENV}={opts.gpus_per_node}"]


def _elastic_directives(opts: ExportOptions) -> list[str]:
    """sbatch --no-kill: "Do not automatically terminate a job if one of the nodes it has been
    allocated fails" (slurm.schedmd.com/sbatch.html, -k/--no-kill), so the survivors go on."""
    return ["#SBATCH --no-kill"] if opts.elastic else []


def _elastic_comment(opts: ExportOptions) -> list[str]:
    if not opts.elastic:
        return []
    return [f"# Elastic: torchrun runs on {opts.min_nodes} or more of the nodes; when one fails "
            "the others",
            "# re-plan for their GPUs and resume from the newest checkpoint. The rendezvous "
            "lives on the",
            "# first node: if that one fails the job ends (an etcd rendezvous avoids that)."]


@dataclass(frozen=True)
class StopWarning:
    """How long before the time limit the job's ranks get SIGTERM (#SBATCH --signal), and how
    that was sized.

    At the time limit SLURM sends SIGTERM and, KillWait later (slurm.conf(5): 30 s by
    default), SIGKILL. autoplan's ranks stop on SIGTERM at the end of the step in progress
    and save a checkpoint (runtime/worker.py), which needs a step and a save, often more than
    KillWait. `--signal=TERM@N` without `B:` signals every job step, the srun running torchrun
    and its ranks, but not the batch shell (sbatch(1)); `B:` would signal only the shell,
    which waits on srun and passes nothing on."""

    seconds_s: int
    step_s: float | None
    """One step as priced; None: not priced here."""
    band: float
    """The price's error band (0.12: +-12%); the warning allows for its upper edge."""
    priced_by: str
    """Where step_s comes from, for the script's comment."""

    def comment(self) -> list[str]:
        if self.step_s is None:
            step = (f"a guessed {UNPRICED_STEP_S} s for one step (no price here: the plan's "
                    "profile does not load and the plan holds no predicted step)")
        else:
            step = f"one step, {self.step_s:.3g} s + {self.band:.0%} {self.priced_by},"
        capped = f", capped at sbatch's {SIGNAL_MAX_S} s" if self.seconds_s == SIGNAL_MAX_S else ""
        return comment(
            f"--signal=TERM@{self.seconds_s}: at the time limit SLURM sends SIGTERM only "
            "KillWait (30 s by default) before SIGKILL; this sends it that many seconds before "
            "the limit to every process of the srun step, torchrun and the ranks (not B:, which "
            "signals only this batch shell), so the ranks finish their step and save a "
            f"checkpoint. Sized as {step} plus {SAVE_MARGIN_S} s for the save, which autoplan "
            f"does not price{capped}. {SHUTDOWN_ENV} lets torchrun wait as long before it "
            "kills its ranks, but only a torchrun that has --shutdown-timeout reads it "
            "(pytorch/pytorch#172596, 2026; see `torchrun --help`): an older torchrun ignores "
            "it and SIGKILLs the ranks 30 s after passing SIGTERM on, whatever the warning, so "
            f"their step and save must then fit in 30 s. For more time: {SHUTDOWN_ENV}=S sbatch "
            "--signal=TERM@S <this script>. A scancel or a preemption still allows only "
            "KillWait.")


def stop_warning(plan: Plan, model: ModelSpec, gpus_per_node: int) -> StopWarning:
    """The time-limit warning: one step as the job runs it (autoplan's runtime on nodes of
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
    seconds = min(SIGNAL_MAX_S, math.ceil(allowed) + SAVE_MARGIN_S)
    return StopWarning(seconds, step, float(band), by)
