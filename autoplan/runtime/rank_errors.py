"""A rank's refusal, told to the launcher: the worker writes its AutoplanError (message and exit
code) into the launcher's temporary folder, and the launcher says it in one line with that code,
where torchrun alone would print its ChildFailedError traceback and exit 1."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from autoplan.errors import AutoplanError


def quiet_torchrun(argv: list[str]) -> int:
    """torchrun's main on argv[1:]; when it fails because a rank refused (a file in the folder
    argv[0], rank_error_file), exit 1 without torchrun's traceback and failure log."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    folder = argv[0]
    for name in ("torch.distributed.elastic.multiprocessing.api",
                 "torch.distributed.elastic.agent.server.api"):
        logging.getLogger(name).addFilter(lambda _record: read_rank_error(folder) is None)
    try:
        main(argv[1:])
    except ChildFailedError:
        if read_rank_error(folder) is None:
            raise
        return 1
    return 0


class RankRefusal(AutoplanError):
    """A refusal (an AutoplanError) a rank raised, with its message and exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message.replace("\r", "\\r").replace("\n", "\\n"))
        self.exit_code = exit_code


def rank_error_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"error.rank{rank}.json")


def write_rank_error(folder: str, rank: int, err: AutoplanError) -> bool:
    """A rank's refusal for the launcher (atomically: the launcher never reads half a file);
    False when it cannot be written (the rank then prints it itself)."""
    path = rank_error_file(folder, rank)
    try:
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            json.dump({"message": str(err), "exit_code": int(err.exit_code)}, f)
        os.replace(f"{path}.tmp", path)
    except OSError:
        return False
    return True


def read_rank_error(folder: str) -> RankRefusal | None:
    """The refusal of the lowest rank that wrote one into `folder`, or None."""
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    ranks = sorted(int(n[len("error.rank"):-len(".json")]) for n in names
                   if n.startswith("error.rank") and n.endswith(".json")
                   and n[len("error.rank"):-len(".json")].isdigit())
    for rank in ranks:
        try:
            data = json.loads(Path(rank_error_file(folder, rank)).read_text(encoding="utf-8"))
            code = data["exit_code"]
            message = str(data["message"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(code, int) and 1 <= code <= 255:
            return RankRefusal(message, code)
    return None
