"""torchrun command lines shared by the torchrun, SLURM and Kubernetes targets.

The launched program is `autoplan train PLAN` (the built-in runtime reads every plan field); under
torchrun it runs in place, one process per GPU. Scheduler specifics stay in their own modules.
"""

from __future__ import annotations

import shlex

from autoplan.export.base import ExportOptions, Layout


def train_argv(opts: ExportOptions, plan_path: str | None = None) -> list[str]:
    """`autoplan train PLAN --checkpoint-dir D --resume` (resume picks up after a restart)."""
    return [
        "autoplan",
        "train",
        plan_path or opts.plan_path,
        "--checkpoint-dir",
        opts.checkpoint_dir,
        "--resume",
    ]


def torchrun_argv(
    lay: Layout, opts: ExportOptions, *, rdzv_host: str | None, rdzv_id: str | None
) -> list[str]:
    """torchrun options: standalone on one node, c10d rendezvous at `rdzv_host` otherwise.

    `rdzv_host`/`rdzv_id` may be shell expressions (e.g. "$head_node"); callers quote them.
    """
    argv = ["torchrun", f"--nnodes={lay.num_nodes}", f"--nproc-per-node={lay.nproc_per_node}"]
    if lay.num_nodes == 1 and rdzv_host is None:
        argv.append("--standalone")
    else:
        argv += [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_host}:{opts.rdzv_port}",
            f"--rdzv-id={rdzv_id or opts.job_name}",
        ]
    argv += [f"--max-restarts={opts.max_restarts}", "--no-python"]
    return argv


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
