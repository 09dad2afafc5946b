"""`--to slurm`: an sbatch script that runs torchrun once per node with srun.

c10d rendezvous on the job's first node; nodes and GPUs per node come from the plan and the
hardware profile (a CPU profile's plan asks for CPUs: one per rank, no GPUs); torchrun restarts the worker group up to --max-restarts times and
`autoplan train --resume` continues from the checkpoint directory. `--elastic`: torchrun
`--nnodes=MIN:MAX`, a job SLURM keeps when a node fails, and `autoplan train --elastic`, which
re-plans for the nodes left, on nodes of the size written (--gpus-per-node). `--signal` warns the
ranks one priced step and a checkpoint save before the time limit (stop_warning); a job whose ranks
stopped on it and saved ends with exit 0 and a line on how to resume (end_lines, the shell lines
of saved_step.py). Its length and #SBATCH --time are job_length.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from autoplan.errors import ConfigError
from autoplan.export import saved_step
from autoplan.export.base import ExportOptions, ExportTarget, Layout, layout, layout_reasons
from autoplan.export.job_inputs import check_lines
from autoplan.export.job_length import time_limit, tokens_comment
from autoplan.export.launch import (
    ELASTIC_ENV,
    SHUTDOWN_ENV,
    LaunchOptions,
    StopLead,
    all_steps,
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
    plural,
    runtime_reasons,
    shell_join,
    stop_lead,
    torchrun_argv,
    train_argv,
)
from autoplan.export.nodes import NODE_SIZE_ENV
from autoplan.export.saved_step import stopped_line
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV

SIGNAL_MAX_S = 65535
"""sbatch(1) --signal: "sig_time must have an integer value between 0 and 65535"."""
SAVED_STEP_FILE = "autoplan-saved-step-$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"
"""SAVED_STEP_ENV's file in the checkpoint folder, which every node reads (the batch shell
runs on the first node, rank 0 on any): a name of this run of this job, which no earlier run
left and this node never looked up (an NFS client may cache a name it saw missing)."""


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
        launch.append(shell_join(train_argv(opts, lay=lay, cpu=cpu)) + " || status=$?")
        warning = stop_warning(plan, model, opts.gpus_per_node)
        limit = time_limit(run, slurm_options(opts).time_limit, warning.lead, warning.seconds_s)
        text = "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name={opts.job_name}",
                f"#SBATCH --nodes={lay.num_nodes}",
                "#SBATCH --ntasks-per-node=1",
                _device_directive(lay, cpu),
                "#SBATCH --exclusive",
                *_elastic_directives(opts),
                *_requeue_directives(run),
                f"#SBATCH --signal=TERM@{warning.seconds_s}",
                *limit.directive(),
                f"#SBATCH --output={opts.job_name}-%j.out",
                "#",
                "# Written by `autoplan export --to slurm`: one torchrun per node (srun), one process",
                f"# per {unit}; plan: dp={plan.parallel.dp} tp={plan.parallel.tp} "
                f"pp={plan.parallel.pp} cp={plan.parallel.cp} on {lay.num_nodes} x "
                f"{lay.nproc_per_node} {unit}s.",
                *checkpoint_lines(opts, lay.num_nodes, "the mkdir below runs on the first "
                                  "node only" if lay.num_nodes > 1 else ""),
                *data_lines(opts, "on every node: keep it on storage they all read"),
                *tokens_comment(run, plan, model),
                *warning.comment(),
                *limit.comment(),
                *warning.end_comment(run.steps, run.requeue),
                *_elastic_comment(opts),
                "set -euo pipefail",
                *check_lines(run.plan_path, run.plan_sha256, run.named_files),
                "",
                "# The first node hosts the c10d rendezvous.",
                'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"mkdir -p {shell_join([opts.checkpoint_dir])}",
                "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
                f"export {SHUTDOWN_ENV}=${{{SHUTDOWN_ENV}:-{warning.seconds_s}}}",
                saved_step.env_line(opts.checkpoint_dir, SAVED_STEP_FILE),
                *(elastic_env_lines(opts) if opts.elastic else []),
                "",
                "status=0",
                continued(launch),
                *end_lines(opts),
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


def _requeue_directives(run: LaunchOptions) -> list[str]:
    """sbatch --requeue: "Specifies that the batch job should be eligible for requeuing"
    (slurm.schedmd.com/sbatch.html), which `scontrol requeue` of a job that disallows it
    refuses; --open-mode=append keeps each run's log, which a requeued job's restart would
    truncate by default (sbatch: "append" or "truncate", the default set by JobFileAppend)."""
    return ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if run.requeue else []


@dataclass(frozen=True)
class SlurmOptions(LaunchOptions):
    """LaunchOptions plus what only the sbatch script writes."""

    time_limit: str | None = None
    """#SBATCH --time: None or "none", no --time (the partition's limit applies; the header
    advises the priced run, TimeLimit); else a SLURM time, the most the job may run: a run priced longer is
    refused (exit 3) unless it requeues itself (--requeue), then it runs in several turns."""


def slurm_options(opts: ExportOptions) -> SlurmOptions:
    """`opts` as SlurmOptions: the sbatch-only settings at their defaults where none were given."""
    if isinstance(opts, SlurmOptions):
        return opts
    run = launch_options(opts)
    return SlurmOptions(**{f.name: getattr(run, f.name) for f in fields(LaunchOptions)})



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
    """How long before the time limit the job's ranks get SIGTERM (#SBATCH --signal): the stop
    lead (launch.stop_lead), at most what sbatch takes.

    At the time limit SLURM sends SIGTERM and, KillWait later (slurm.conf(5): 30 s by
    default), SIGKILL. autoplan's ranks stop on SIGTERM at the end of the step in progress
    and save a checkpoint (runtime/worker.py), which needs a step and a save, often more than
    KillWait. `--signal=TERM@N` without `B:` signals every job step, the srun running torchrun
    and its ranks, but not the batch shell (sbatch(1)); `B:` would signal only the shell,
    which waits on srun and passes nothing on."""

    lead: StopLead

    @property
    def seconds_s(self) -> int:
        return min(SIGNAL_MAX_S, self.lead.seconds_s)

    def comment(self) -> list[str]:
        capped = (f", capped at sbatch's {SIGNAL_MAX_S} s" if self.lead.seconds_s > SIGNAL_MAX_S
                  else "")
        return comment(
            f"--signal=TERM@{self.seconds_s}: at the time limit SLURM sends SIGTERM only "
            "KillWait (30 s by default) before SIGKILL; this sends it that many seconds before "
            "the limit to every process of the srun step, torchrun and the ranks (not B:, which "
            "signals only this batch shell), so the ranks finish their step and save a "
            f"checkpoint. Sized as {self.lead.sized_as()}{capped}. {SHUTDOWN_ENV} lets torchrun "
            "wait as long before it kills its ranks, but only a torchrun that has "
            "--shutdown-timeout reads it (pytorch/pytorch#172596, 2026; see `torchrun --help`): "
            "an older torchrun ignores it and SIGKILLs the ranks 30 s after passing SIGTERM on, "
            "whatever the warning, so their step and save must then fit in 30 s. For more time: "
            f"{SHUTDOWN_ENV}=S sbatch --signal=TERM@S <this script>. A scancel or a preemption "
            "still allows only KillWait.")

    def end_comment(self, steps: int, requeue: bool = False) -> list[str]:
        head = ("Exit status: torchrun exits 1 once it has passed a SIGTERM on, whatever its "
                f"ranks did, which SLURM would record as FAILED. Rank 0 writes the step of the "
                f"last checkpoint to ${SAVED_STEP_ENV} (in the checkpoint folder) once every "
                "rank has saved it. ")
        # elastic rounds too: every rank finds a checkpoint at --steps before it re-plans
        # (runtime/resume.elastic_trained_already)
        tail = " " + saved_step.traceback_note(" in the job log") + " " + saved_step.done_note(steps)
        if requeue:
            return comment(
                head + f"Stopped short of {steps} {plural(steps, 'step')} after such a save, the script requeues "
                "this job (scontrol requeue $SLURM_JOB_ID; the partition must allow it), which "
                "resumes from that checkpoint when it runs again; the job ends COMPLETED only "
                f"once {all_steps(steps)} {'is' if steps == 1 else 'are'} trained, so an afterok dependency waits for the "
                "trained model. If the requeue is refused the script exits 1 with a line saying "
                "so. A crash, or ranks killed before their save, keeps srun's status." + tail)
        return comment(
            head + "The script then exits 0 with a line in the job log naming the step and how "
            "to resume: a job stopped by the time-limit warning after a clean save ends "
            "COMPLETED. So an afterok dependency starts after each such stop, before "
            f"{all_steps(steps)} {'is' if steps == 1 else 'are'} trained: it suits the next run of this script, not a job that "
            "needs the trained model (export with --requeue for that). A crash, or ranks "
            "killed before their save, keeps srun's status." + tail)


def stop_warning(plan: Plan, model: ModelSpec, gpus_per_node: int) -> StopWarning:
    """The time-limit warning: the stop lead of the job as written (launch.stop_lead)."""
    return StopWarning(stop_lead(plan, model, gpus_per_node))


def _requeue_lines(run: LaunchOptions, folder: str, cause: str) -> list[str]:
    """The stop branch under --requeue: say it, requeue the job, and exit 1 with a line where
    SLURM refuses (a partition or job that disallows requeue), so the stop is not taken for
    success while nothing will resume it."""
    requeued = "requeueing job $SLURM_JOB_ID, which resumes from it when it runs again"
    refused = ("autoplan: scontrol requeue %s was refused (the job or partition may not allow "
               "requeue): submit this script again to resume\\n")
    return ["  " + stopped_line(run.steps, folder, cause, f'"{requeued}"'),
            '  if ! scontrol requeue "$SLURM_JOB_ID"; then',
            f'    printf {shell_join([refused])} "$SLURM_JOB_ID"',
            "    exit 1",
            "  fi"]


def end_lines(opts: ExportOptions) -> list[str]:
    """After srun (its status in $status), saved_step.end_lines: where rank 0 named the step
    its ranks saved as the run ended cleanly, exit 0, with a line on how to resume (or a
    requeue) where that step is short of --steps, or on srun's status where every step was
    trained yet srun failed; elsewhere srun's status. The stop line names the warning by its
    flag, not by the time written above, which `sbatch --signal` may replace at submission."""
    run = launch_options(opts)
    again = (f"sbatch {shell_join([os.path.abspath(opts.out)])} resumes from it" if opts.out
             else "submitting this script again resumes from it")
    cause = "the time-limit warning that --signal sets, or a scancel --signal=TERM"
    folder = shell_join([opts.checkpoint_dir])
    # srun reports a failed task's status though the other nodes trained every step: torchrun's
    # exit after passing a SIGTERM on, or under --elastic a node lost (the others finished)
    lost = "; under --elastic a lost node also sets it" if opts.elastic else ""
    on_stop = (_requeue_lines(run, folder, cause) if run.requeue
               else ["  " + stopped_line(run.steps, folder, cause, shell_join([again]))])
    return saved_step.end_lines(run.steps, folder, launcher="srun", on_stop=on_stop,
                                why_failed=f"torchrun exits 1 after passing on a SIGTERM{lost}")
