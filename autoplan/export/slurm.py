"""`--to slurm`: an sbatch script that runs torchrun once per node with srun.

c10d rendezvous on the job's first node; nodes and GPUs per node come from the plan and the
hardware profile; torchrun restarts the worker group up to --max-restarts times and
`autoplan train --resume` continues from the checkpoint directory.
"""

from __future__ import annotations

from autoplan.export.base import ExportOptions, ExportTarget, layout, layout_reasons
from autoplan.export.launch import (
    check_job_name,
    check_path_word,
    continued,
    shell_join,
    torchrun_argv,
    train_argv,
)
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan


class SlurmTarget(ExportTarget):
    name = "slurm"
    summary = "sbatch script: srun + multi-node torchrun (c10d) running `autoplan train PLAN`"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        check_job_name(opts.job_name)  # it names the job, its log and the script file
        check_path_word("--checkpoint-dir", opts.checkpoint_dir)
        check_path_word("PLAN", opts.plan_path)
        return layout_reasons(plan, opts.gpus_per_node)

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        argv = torchrun_argv(lay, opts, rdzv_host="$head_node", rdzv_id="$SLURM_JOB_ID")
        launch = [shell_join(["srun"], keep=("$",))]
        launch += [shell_join([w], keep=("$",)) for w in argv]
        launch.append(shell_join(train_argv(opts)))
        text = "\n".join(
            [
                "#!/bin/bash",
                f"#SBATCH --job-name={opts.job_name}",
                f"#SBATCH --nodes={lay.num_nodes}",
                "#SBATCH --ntasks-per-node=1",
                f"#SBATCH --gpus-per-node={lay.nproc_per_node}",
                "#SBATCH --exclusive",
                f"#SBATCH --output={opts.job_name}-%j.out",
                "#",
                "# Written by `autoplan export --to slurm`: one torchrun per node (srun), one process",
                f"# per GPU; plan: dp={plan.parallel.dp} tp={plan.parallel.tp} pp={plan.parallel.pp}"
                f" cp={plan.parallel.cp} on {lay.num_nodes} x {lay.nproc_per_node} GPUs.",
                "set -euo pipefail",
                "",
                "# The first node hosts the c10d rendezvous.",
                'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                f"mkdir -p {shell_join([opts.checkpoint_dir])}",
                "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}",
                "",
                continued(launch),
                "",
            ]
        )
        return {f"{opts.job_name}.sbatch": text}
