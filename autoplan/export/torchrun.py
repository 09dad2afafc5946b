"""`--to torchrun`: the torchrun command line that runs `autoplan train PLAN` on each node.

One node: `--standalone`. Several nodes: the same command on every node, with a c10d rendezvous on
the first node, whose address the script reads from RDZV_HOST. A CPU profile's plan trains on gloo.
"""

from __future__ import annotations

from autoplan.export.base import ExportOptions, ExportTarget, layout, layout_reasons
from autoplan.export.job_inputs import check_lines
from autoplan.export.launch import (
    check_job_name,
    check_min_nodes,
    check_train_data,
    check_train_run,
    checkpoint_lines,
    continued,
    data_lines,
    launch_options,
    on_cpu,
    runtime_reasons,
    shell_join,
    torchrun_argv,
    train_argv,
)
from autoplan.model_spec import ModelSpec
from autoplan.plan import Plan


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
        head = [
            "#!/usr/bin/env bash",
            "# torchrun launch written by `autoplan export --to torchrun`.",
        ]
        if lay.num_nodes == 1:
            argv = torchrun_argv(lay, opts, rdzv_host=None, rdzv_id=None)
            head.append(f"# One node, {lay.nproc_per_node} {'CPU ' if cpu else ''}processes.")
            head += checkpoint_lines(opts, 1)
            head += data_lines(opts, "of this node")
        else:
            argv = torchrun_argv(lay, opts, rdzv_host="${RDZV_HOST}", rdzv_id=opts.job_name)
            head += [
                f"# Run this same command on each of the {lay.num_nodes} nodes;",
                "# RDZV_HOST is the address of the first node (the c10d rendezvous host).",
                *checkpoint_lines(opts, lay.num_nodes),
                *data_lines(opts, "on every node: keep it on storage they all read"),
                ': "${RDZV_HOST:?set RDZV_HOST to the address of the first node}"',
            ]
        head.append("set -euo pipefail")
        run = launch_options(opts)
        head += check_lines(run.plan_path, run.plan_sha256, run.named_files)
        lines = [shell_join([w], keep=("${",)) for w in argv]
        lines.append(shell_join(train_argv(opts, cpu=cpu)))
        return {"launch.sh": "\n".join(head) + "\n" + continued(lines) + "\n"}
