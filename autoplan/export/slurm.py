"""`--to slurm`: an sbatch script that runs torchrun once per node with srun.

c10d rendezvous on the job's first node; nodes and GPUs per node come from the plan and the
hardware profile (a CPU profile's plan asks for CPUs: one per rank, no GPUs); torchrun restarts the worker group up to --max-restarts times and
`autoplan train --resume` continues from the checkpoint directory. `--elastic`: torchrun
`--nnodes=MIN:MAX`, a job SLURM keeps when a node fails, and `autoplan train --elastic`, which
re-plans for the nodes left, on nodes of the size written (--gpus-per-node).
"""

from __future__ import annotations

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, ExportTarget, Layout, layout, layout_reasons
from autoplan.export.job_inputs import check_lines
from autoplan.export.launch import (
    ELASTIC_ENV,
    check_job_name,
    check_min_nodes,
    check_train_data,
    check_train_run,
    continued,
    data_lines,
    launch_options,
    on_cpu,
    runtime_reasons,
    shell_join,
    torchrun_argv,
    train_argv,
)
from autoplan.export.nodes import NODE_SIZE_ENV
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan


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
        text = "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name={opts.job_name}",
                f"#SBATCH --nodes={lay.num_nodes}",
                "#SBATCH --ntasks-per-node=1",
                _device_directive(lay, cpu),
                "#SBATCH --exclusive",
                *_elastic_directives(opts),
                f"#SBATCH --output={opts.job_name}-%j.out",
                "#",
                "# Written by `autoplan export --to slurm`: one torchrun per node (srun), one process",
                f"# per {unit}; plan: dp={plan.parallel.dp} tp={plan.parallel.tp} "
                f"pp={plan.parallel.pp} cp={plan.parallel.cp} on {lay.num_nodes} x "
                f"{lay.nproc_per_node} {unit}s.",
                *data_lines(opts, "on every node: keep it on storage they all read"),
                *_elastic_comment(opts),
                "set -euo pipefail",
                *check_lines(run.plan_path, run.plan_sha256, run.named_files, run.workdir),
                "",
                "# The first node hosts the c10d rendezvous.",
                'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"mkdir -p {shell_join([opts.checkpoint_dir])}",
                "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
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
