"""A rank's refusal, told to the launcher: the worker writes its AutoplanError (message and exit
code) into the launcher's temporary folder, and the launcher says it in one line with that code,
where torchrun alone would print its ChildFailedError traceback and exit 1. Files are kept per
torchrun attempt (TORCHELASTIC_RESTART_COUNT), each worker marks the attempt it starts in
(mark_attempt), and only the last attempt's refusals are read: under --max-restarts a refusal
of an earlier attempt is not the reason the last one failed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from autoplan.errors import AutoplanError


def quiet_torchrun(argv: list[str]) -> int:
    """torchrun's main on argv[1:]; when it fails because a rank refused (a file in the folder
    argv[0], rank_error_file), exit 1 without torchrun's traceback and failure log. Its agent
    records every failed attempt there (rank_failures.FailureRecorder), and a last attempt
    that failed because a rank was killed by a signal also exits 1 without the traceback: the
    launcher names the rank (rank_failures.read_failure)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    from autoplan.runtime.rank_failures import FailureRecorder, read_failure

    folder = argv[0]
    for name in ("torch.distributed.elastic.multiprocessing.api",
                 "torch.distributed.elastic.agent.server.api"):
        logging.getLogger(name).addFilter(lambda _record: read_rank_error(folder) is None)
    FailureRecorder(folder).install()
    try:
        main(argv[1:])
    except ChildFailedError:
        if read_rank_error(folder) is None:
            failure = read_failure(folder)
            if failure is None or not failure.signalled:
                raise
        return 1
    return 0


class RankRefusal(AutoplanError):
    """A refusal (an AutoplanError) a rank raised, with its message and exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))
        self.exit_code = exit_code


def restart_count() -> int:
    """This worker's torchrun attempt: 0 first, one more after each restart (torchrun sets
    TORCHELASTIC_RESTART_COUNT for its workers; 0 outside torchrun)."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def rank_error_file(folder: str, rank: int, attempt: int = 0) -> str:
    return os.path.join(folder, f"error.attempt{attempt}.rank{rank}.json")


def _attempt_rank(name: str) -> tuple[int, int] | None:
    """(attempt, rank) of an error file's name, or None for any other name."""
    if not (name.startswith("error.attempt") and name.endswith(".json")):
        return None
    attempt, _, rank = name[len("error.attempt"):-len(".json")].partition(".rank")
    return (int(attempt), int(rank)) if attempt.isdigit() and rank.isdigit() else None


def _started(name: str) -> int | None:
    """The attempt a start marker (mark_attempt) names, or None for any other name."""
    if not (name.startswith("started.attempt") and name[len("started.attempt"):].isdigit()):
        return None
    return int(name[len("started.attempt"):])


def mark_attempt(folder: str) -> None:
    """Record that this torchrun attempt started (every rank may; one empty file per attempt).
    Best effort: without it a refusal is still read, only not told apart from a later crash."""
    try:
        Path(folder, f"started.attempt{restart_count()}").touch()
    except OSError:
        pass


def write_rank_error(folder: str, rank: int, err: AutoplanError,
                     attempt: int | None = None) -> bool:
    """A rank's refusal for the launcher (atomically: the launcher never reads half a file), in
    this torchrun attempt's name unless `attempt` is given; False when it cannot be written (the
    rank then prints it itself)."""
    path = rank_error_file(folder, rank, restart_count() if attempt is None else attempt)
    try:
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            json.dump({"message": str(err), "exit_code": int(err.exit_code)}, f)
        os.replace(f"{path}.tmp", path)
    except OSError:
        return False
    return True


def read_rank_error(folder: str) -> RankRefusal | None:
    """The refusal of the lowest rank that wrote one into `folder` in the last attempt that
    started (mark_attempt) or wrote one, or None: a refusal of an earlier attempt is not why a
    restarted one failed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    found = sorted(key for key in map(_attempt_rank, names) if key is not None)
    starts = [n for n in map(_started, names) if n is not None]
    last = max([attempt for attempt, _ in found] + starts, default=0)
    for attempt, rank in found:
        if attempt != last:
            continue
        try:
            data = json.loads(Path(rank_error_file(folder, rank, attempt)).read_text(
                encoding="utf-8"))
            code = data["exit_code"]
            message = str(data["message"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(code, int) and 1 <= code <= 255:
            return RankRefusal(message, code)
    return None
