"""How a launch script ends after torchrun: torchrun exits 1 once it has passed a SIGTERM on,
whatever its ranks did, so the step rank 0 names once every rank saved (SAVED_STEP_ENV) tells a
clean stop from a crash. The SLURM and torchrun scripts share these shell lines."""

from __future__ import annotations

from autoplan.export.launch import all_steps, comment, shell_join
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV, STEP_DIR_FORMAT, step_dir

FILE = f'"${SAVED_STEP_ENV}"'
"""The step file as the script names it (the variable, exported where the script sets it)."""


SIGNAL_TRACEBACK = ("torch.distributed.elastic.multiprocessing.api.SignalException: Process N "
                    "got signal: 15")
"""The last line of the traceback torchrun prints as it exits on a SIGTERM it passed on to its
ranks (torch/distributed/elastic/multiprocessing/api.py, _terminate_process_handler; torch
2.13), which a clean stop prints before the script's own line."""


def traceback_note(where: str = "") -> str:
    """The header's word on that traceback (`where`: e.g. " in the job log")."""
    return (f"A stop by a signal prints torchrun's own traceback{where} ({SIGNAL_TRACEBACK}) "
            "before the script's line: torchrun's exit after passing the signal on, expected, "
            "and no error of the run.")


def done_note(steps: int) -> str:
    """The header's word on a job started again once its run is done: every rank finds the
    checkpoint at --steps, rank 0 says so, and all exit 0 having written nothing (no step file:
    the script ends on the launcher's 0; runtime/resume.py)."""
    return (f"Started again once {all_steps(steps)} {'is' if steps == 1 else 'are'} trained "
            "(resubmitted, requeued, chained), the ranks train nothing: one line says so and "
            "the script exits 0.")


def env_line(checkpoint_dir: str, name: str) -> str:
    """`export SAVED_STEP_ENV=<checkpoint_dir>/"<name>"`: the file lies in the checkpoint
    folder, which every node reads; `name` may hold shell expansions (it is double-quoted)."""
    return f'export {SAVED_STEP_ENV}={shell_join([checkpoint_dir])}/"{name}"'


def stopped_line(steps: int, folder: str, cause: str, then: str, *,
                 signal: str = "SIGTERM") -> str:
    """The printf of a stop short of `steps` after a clean save: the step ($saved), the
    checkpoint and its `folder` (a shell word), the `cause` (what sent `signal`) and `then`
    (a shell word: what to do next)."""
    text = (f"autoplan: the ranks stopped on {signal} after step %s of {steps} and saved "
            f"checkpoint {STEP_DIR_FORMAT} in %s ({cause}): %s\\n")
    return f'printf {shell_join([text])} "$saved" "$saved" {folder} {then}'


STALE_RULE = ("a line that reads as it read before torchrun started is an earlier attempt's, "
              "and the pod ends with torchrun's status: rank 0 writes it only once every rank "
              "saved, and a clean stop trains at least one step past the checkpoint it resumed "
              "from, the newest, so each attempt's stop names a step no earlier line did")
"""Why a kept file's line, unchanged since the script read it at its start, is stale (several
pods share the file, so none removes it; kube_ending writes this in the header)."""


def start_lines() -> list[str]:
    """Before the launch: the file's line as it reads now, in $before (empty without one), for
    end_lines(unchanged_is_stale=True)."""
    return ["before=", f"if [ -f {FILE} ]; then read -r before < {FILE} || true; fi  # stale "
            "if unchanged at the end"]


def end_lines(steps: int, folder: str, *, launcher: str, on_stop: list[str],
              why_failed: str = "torchrun exits 1 after passing on a SIGTERM",
              wait_s: int = 0, keep_file: bool = False,
              unchanged_is_stale: bool = False) -> list[str]:
    """After the launch, its status in $status: where rank 0 named the step its ranks saved
    as the run ended cleanly, exit 0, running `on_stop` (lines of the branch, e.g. a
    stopped_line) where that step is short of `steps`, or saying the `launcher`'s status and
    `why_failed` where every step was trained yet it failed; elsewhere the launcher's status.
    `folder` is the checkpoint folder as a shell word. `wait_s`: seconds to wait for the file
    after a failed launch (on several torchrun nodes, rank 0's may end after this one's, and
    rank 0 writes the file last); `keep_file` leaves it for other nodes to read (the script
    removes it before the launch, unless `unchanged_is_stale`: then a line that reads as
    start_lines read it is an earlier attempt's, STALE_RULE, and the launcher's status stands)."""
    finished = (f"autoplan: trained {all_steps(steps)} and saved checkpoint {step_dir(steps)} "
                f"in %s; {launcher}'s status was %s ({why_failed})\\n")
    wait = ['if [ "$status" -ne 0 ]; then  # rank 0 may write it after this node\'s ranks '
            "ended",
            f"  for ((i = 0; i < {wait_s}; i++)); do [ -f {FILE} ] && break; sleep 1; done",
            "fi"] if wait_s else []
    return [
        "",
        *comment("torchrun exits 1 after a SIGTERM whatever its ranks did: the step rank 0 "
                 "names once they all saved tells a clean stop from a crash."),
        *wait,
        "saved=",
        f"if [ -f {FILE} ]; then",
        f"  read -r saved < {FILE} || true",
        *([] if keep_file else [f"  rm -f -- {FILE}"]),
        "fi",
        *(['[ "$saved" != "$before" ] || saved=  # an earlier attempt\'s line: not this one\'s']
          if unchanged_is_stale else []),
        "case $saved in",
        f"  '' | *[!0-9]*) exit \"$status\" ;;  # no clean end: {launcher}'s status",
        "esac",
        f'if [ "$saved" -lt {steps} ]; then',
        *on_stop,
        'elif [ "$status" -ne 0 ]; then',
        f'  printf {shell_join([finished])} {folder} "$status"',
        "fi",
        "exit 0",
    ]
