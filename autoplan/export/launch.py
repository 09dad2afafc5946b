"""torchrun command lines shared by the torchrun, SLURM and Kubernetes targets.

The launched program is `autoplan train PLAN` (the built-in runtime reads every plan field); under
torchrun it runs in place, one process per GPU. Scheduler specifics stay in their own modules.
"""

from __future__ import annotations

import re
import shlex

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, Layout

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


ELASTIC_TARGETS = ("slurm", "kubernetes")
"""Targets whose launch is torchrun, which `--elastic` turns into its MIN:MAX form."""
ELASTIC_CHECKPOINT_EVERY = 100
"""Steps between checkpoints of an exported elastic job: a lost node costs at most this many."""
ELASTIC_ENV = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
"""Set for elastic torchrun (autoplan.runtime.launch.ELASTIC_ENV says why)."""


def elastic_reasons(lay: Layout, opts: ExportOptions) -> list[str]:
    """Why --elastic/--min-nodes cannot apply to this layout (empty when they can)."""
    if not opts.elastic:
        return [] if opts.min_nodes == 1 else [f"--min-nodes {opts.min_nodes} needs --elastic"]
    if not 1 <= opts.min_nodes <= lay.num_nodes:
        return [f"--min-nodes {opts.min_nodes}: expected 1 to the plan's {lay.num_nodes} "
                "node(s)"]
    return []


def train_argv(opts: ExportOptions, plan_path: str | None = None,
               lay: Layout | None = None) -> list[str]:
    """`autoplan train PLAN --checkpoint-dir D --resume` (resume picks up after a restart);
    elastic: `--elastic --min-gpus N --checkpoint-every K` as well (`lay` gives N)."""
    argv = [
        "autoplan",
        "train",
        plan_path or opts.plan_path,
        "--checkpoint-dir",
        opts.checkpoint_dir,
        "--resume",
    ]
    if opts.elastic:
        argv += ["--checkpoint-every", str(ELASTIC_CHECKPOINT_EVERY), "--elastic"]
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
