"""`--to torchrun`: the torchrun command line that runs `autoplan train PLAN` on each node.

One node: `--standalone`. Several nodes: the same command on every node, with a c10d rendezvous on
the first node, whose address the script reads from RDZV_HOST. A CPU profile's plan trains on gloo.
A run stopped cleanly by a signal exits 0 naming the step saved (saved_step.py), where torchrun
itself exits 1.
"""

from __future__ import annotations

import os

from autoplan.export import saved_step
from autoplan.export.base import ExportOptions, ExportTarget, layout, layout_reasons
from autoplan.export.job_inputs import check_lines
from autoplan.export.job_length import tokens_comment
from autoplan.export.launch import (
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
    torchrun_argv,
    train_argv,
)
from autoplan.export.saved_step import stopped_line
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV


class TorchrunTarget(ExportTarget):
    name = "torchrun"
    summary = "torchrun command line launching `autoplan train PLAN` (runs every plan field)"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        check_job_name(opts.job_name)  # --rdzv-id: inside "..." next to ${RDZV_HOST}
        check_train_run(opts)
        check_train_data(opts, model)
        check_min_nodes(opts)  # --elastic itself is refused by the CLI (ELASTIC_TARGETS)
        return layout_reasons(plan, opts.gpus_per_node) + runtime_reasons(plan, model)

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        cpu = on_cpu(plan)
        run = launch_options(opts)
        head = [
            "#!/usr/bin/env bash",
            "# torchrun launch written by `autoplan export --to torchrun`.",
        ]
        if lay.num_nodes == 1:
            argv = torchrun_argv(lay, opts, rdzv_host=None, rdzv_id=None)
            head.append(f"# One node, {lay.nproc_per_node} {'CPU ' if cpu else ''}processes.")
            head += checkpoint_lines(opts, 1)
            head += data_lines(opts, "of this node")
            head += tokens_comment(run, plan, model)
            head += _end_comment(run.steps, 1)
        else:
            argv = torchrun_argv(lay, opts, rdzv_host="${RDZV_HOST}", rdzv_id=opts.job_name)
            head += [
                f"# Run this same command on each of the {lay.num_nodes} nodes;",
                "# RDZV_HOST is the address of the first node (the c10d rendezvous host).",
                *checkpoint_lines(opts, lay.num_nodes),
                *data_lines(opts, "on every node: keep it on storage they all read"),
                *tokens_comment(run, plan, model),
                *_end_comment(run.steps, lay.num_nodes),
                ': "${RDZV_HOST:?set RDZV_HOST to the address of the first node}"',
            ]
        head.append("set -euo pipefail")
        head += check_lines(run.plan_path, run.plan_sha256, run.named_files)
        lines = [shell_join([w], keep=("${",)) for w in argv]
        lines.append(shell_join(train_argv(opts, cpu=cpu)) + " || status=$?")
        launch = [
            saved_step.env_line(opts.checkpoint_dir, f"{SAVED_STEP_FILE}{opts.job_name}"),
            f"rm -f -- {saved_step.FILE}  # an earlier run's: rank 0 writes this run's at its end",
            "trap : TERM  # outlive a SIGTERM to the process group, to read the step saved",
            "status=0",
            continued(lines),
        ]
        return {"launch.sh": "\n".join([*head, *launch, *_end_lines(opts, lay.num_nodes)])
                + "\n"}


SAVED_STEP_FILE = "autoplan-saved-step-"
"""The start of SAVED_STEP_ENV's file in the checkpoint folder, named after the job (the
rendezvous id), so every node of the run names the same file."""
SAVED_STEP_WAIT_S = 30
"""Seconds a node's script waits for the step file after torchrun failed, on several nodes:
rank 0 writes it after the last collective, which may be after this node's ranks ended."""


def _end_comment(steps: int, num_nodes: int) -> list[str]:
    """The header's word on the exit status (saved_step.end_lines)."""
    nodes = (f" On several nodes each node's script reads the file rank 0 writes, waiting up to "
             f"{SAVED_STEP_WAIT_S} s for it after torchrun failed (rank 0's node may end "
             "last)." if num_nodes > 1 else "")
    return comment(
        "Exit status: torchrun exits 1 once it has passed a SIGTERM or Ctrl-C on, whatever its "
        f"ranks did. Rank 0 writes the step of the last checkpoint to ${SAVED_STEP_ENV} (in "
        "the checkpoint folder) once every rank has saved it; the script then exits 0, with a "
        f"line naming the step and how to resume where it is short of {steps} {plural(steps, 'step')}. A crash, "
        "or ranks killed before their save, keeps torchrun's status. Stop a run by sending "
        "SIGTERM to torchrun or to this script's process group (kill -TERM -- -PGID, as timeout "
        "and systemd do): the script outlives it to read the step. "
        + saved_step.traceback_note() + " " + saved_step.done_note(steps) + nodes)


def _end_lines(opts: ExportOptions, num_nodes: int) -> list[str]:
    """After torchrun (its status in $status), saved_step.end_lines: exit 0 where the ranks
    ended cleanly, with a line on how to resume where they stopped short of --steps. On
    several nodes the file stays for the other nodes to read (the next run removes it)."""
    run = launch_options(opts)
    again = (f"bash {shell_join([os.path.abspath(opts.out)])}" if opts.out
             else "running this script again")
    every = f" on each of the {num_nodes} nodes" if num_nodes > 1 else ""
    folder = shell_join([opts.checkpoint_dir])
    stopped = stopped_line(run.steps, folder, "SIGTERM or Ctrl-C",
                           shell_join([f"{again}{every} resumes from it"]), signal="a signal")
    return saved_step.end_lines(
        run.steps, folder, launcher="torchrun", on_stop=["  " + stopped],
        why_failed="it exits 1 after passing on a SIGTERM or Ctrl-C",
        wait_s=SAVED_STEP_WAIT_S if num_nodes > 1 else 0, keep_file=num_nodes > 1)
