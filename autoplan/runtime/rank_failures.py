"""A rank that died (kill -9, the OOM killer, a crash), said once instead of by every rank.

When one rank dies, every other rank fails in its next collective (gloo: "Connection closed by
peer"). Such a rank leaves without a traceback (peer_loss, leave_after_peer): under `autoplan
train` it marks itself in the launcher's folder, under another launcher it says so in one line
(and whether a restart is left); either way it exits 1 and torchrun restarts the job while
--max-restarts allows. Under `autoplan train` the torchrun agent
records each failed attempt's exit codes (FailureRecorder); rank 0 of the restarted attempt
names the rank that died, how, and the step every rank resumes from (restart_line), and the
launcher says it when no restart is left (read_failure). Any other error (a bug, bad input) keeps
its traceback.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""How a collective fails when a peer process is gone (gloo's tcp pair.cc, and the sockets
under it); a peer that is alive but stuck times out instead, which stays an error."""
PEER_LOST_EXIT = 1
"""A rank's exit code when it left because a peer died: non-zero, so torchrun restarts."""


def peer_loss(err: BaseException) -> str | None:
    """Which PEER_LOSS phrase a collective's error carries (its causes and a distributed
    checkpoint's per-rank failures included), or None for any other error."""
    found = _peer_loss_line(err)
    return None if found is None else found[0]


def peer_loss_line(err: BaseException) -> str:
    """The line of the collective's error that carries its PEER_LOSS phrase ('' if none): the
    gloo message, with the address and operation, kept for the launcher (leave_after_peer)."""
    found = _peer_loss_line(err)
    return "" if found is None else found[1]


def _peer_loss_line(err: BaseException) -> tuple[str, str] | None:
    todo, seen = [err], set()
    while todo and len(seen) < 32:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, RuntimeError):
            text = str(exc)
            found = next((phrase for phrase in PEER_LOSS if phrase in text), None)
            if found:
                return found, next(line for line in text.splitlines() if found in line)
        failures = getattr(exc, "failures", None)  # dcp's CheckpointException: rank -> (exc, tb)
        if isinstance(failures, dict):
            todo += [pair[0] for pair in failures.values()
                     if isinstance(pair, tuple) and pair and isinstance(pair[0], BaseException)]
        todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return None


def attempt() -> int:
    """This worker's torchrun attempt (TORCHELASTIC_RESTART_COUNT; 0 outside torchrun)."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def _peer_lost_file(folder: str, attempt_no: int, rank: int) -> Path:
    return Path(folder, f"peer_lost.attempt{attempt_no}.rank{rank}")


def _failures_file(folder: str, attempt_no: int) -> Path:
    return Path(folder, f"failures.attempt{attempt_no}.json")


def leave_after_peer(folder: str | None, rank: int, phrase: str, error: str = "") -> int:
    """This rank's collective failed because a peer is gone: mark it for the launcher (in
    `folder`, `autoplan train`'s; the marker keeps the error's line that carries the phrase,
    which the launcher quotes when no rank died: a connection reset between live hosts) or
    say it in one line;
    returns the exit code."""
    if folder is not None:
        try:
            lines = [line for line in error.splitlines() if phrase in line]
            _peer_lost_file(folder, attempt(), rank).write_text(
                (lines[0] if lines else phrase)[:500], encoding="utf-8")
            return PEER_LOST_EXIT
        except OSError:
            pass
    print(f"[rank{rank}] autoplan: a collective failed ({phrase}): another rank is gone; "
          f"exiting {PEER_LOST_EXIT}{_what_follows()}", file=sys.stderr)
    return PEER_LOST_EXIT


def _what_follows() -> str:
    """What torchrun does after this attempt fails, as its environment tells the worker
    (TORCHELASTIC_MAX_RESTARTS, and the attempt): restart the job while a restart is left,
    else end it; '' outside torchrun, where nothing can be promised."""
    limit = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "")
    if not limit.isdigit():
        return ""
    left = int(limit) - attempt()
    if left > 0:
        return (f" for the launcher to restart the job ({left} of --max-restarts {limit} "
                "left)")
    return f"; no restart is left (--max-restarts {limit}), so the job ends"


@dataclass(frozen=True)
class RankFailure:
    """What ended one torchrun attempt: the ranks that died (rank -> exit code, negative for
    a signal), told apart from those that only left after them."""

    attempt: int
    died: dict[int, int]
    peer_error: str = ""
    """Where no rank died: the first line of a collective's error a rank left on (every rank
    failed its collective, e.g. a connection reset between live hosts)."""

    def describe(self) -> str:
        if not self.died:
            if self.peer_error:
                return f"no rank died, a collective failed: {self.peer_error}"
            return "a rank failed"
        return "; ".join(_death(rank, code) for rank, code in sorted(self.died.items()))

    @property
    def signalled(self) -> bool:
        """Every rank that died was killed by a signal (no traceback of its own to show)."""
        return bool(self.died) and all(code < 0 for code in self.died.values())


def _death(rank: int, code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name}"
    return f"rank {rank} exited with code {code} (its error is above)"


def read_failure(folder: str, attempt_no: int | None = None) -> RankFailure | None:
    """The failure the agent recorded for `attempt_no` (the last recorded one by default), its
    ranks that left after a peer (leave_after_peer) set apart; None when none was recorded."""
    if attempt_no is None:
        recorded = [int(p.name[len("failures.attempt"):-len(".json")])
                    for p in Path(folder).glob("failures.attempt*.json")
                    if p.name[len("failures.attempt"):-len(".json")].isdigit()]
        if not recorded:
            return None
        attempt_no = max(recorded)
    try:
        data = json.loads(_failures_file(folder, attempt_no).read_text(encoding="utf-8"))
        codes = {int(rank): int(code) for rank, code in data["exit_codes"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    died = {rank: code for rank, code in codes.items()
            if not _peer_lost_file(folder, attempt_no, rank).exists()}
    # torchrun SIGTERMs the ranks still running once one failed (a rank's own SIGTERM stops
    # it cleanly: worker._StopFlag): those are not why it failed, and name no cause alone
    first = {rank: code for rank, code in died.items() if code != -signal.SIGTERM}
    error = ""
    if not first:
        for rank in sorted(codes):
            try:
                error = _peer_lost_file(folder, attempt_no, rank).read_text(encoding="utf-8")
            except OSError:
                continue
            if error:
                break
    return RankFailure(attempt_no, first, error.strip())


def restart_line(folder: str | None, resumed_step: int, checkpoint_dir: str | None) -> str:
    """Rank 0's line after a torchrun restart: which rank died and how (when the agent
    recorded it: `folder`), and the step every rank resumes from."""
    now = attempt()
    limit = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "")
    of = f" of {limit}" if limit.isdigit() else ""
    failure = read_failure(folder, now - 1) if folder is not None else None
    what = failure.describe() if failure is not None else "a rank failed"
    if resumed_step:
        where = f"every rank resumes from checkpoint step {resumed_step}"
    elif checkpoint_dir:
        where = "every rank starts over at step 0 (no checkpoint was saved before it)"
    else:
        where = "every rank starts over at step 0 (no --checkpoint-dir)"
    return f"restart {now}{of}: {what}; {where}"


class FailureRecorder:
    """Inside the torchrun agent (rank_errors.quiet_torchrun): records every failed attempt's
    exit codes in `folder`, and drops torchrun's own lines about it, which the restart line or
    the launcher replace (a rank's exit with a code, a crash, keeps torchrun's line)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.attempt = 0

    def install(self) -> bool:
        """Have torchrun's launcher use the recording agent; False where torch differs."""
        try:
            import torch.distributed.launcher.api as launcher
            from torch.distributed.elastic.agent.server.local_elastic_agent import (
                LocalElasticAgent,
            )
        except ImportError:
            return False
        if getattr(launcher, "LocalElasticAgent", None) is not LocalElasticAgent:
            return False
        launcher.LocalElasticAgent = self._agent_class(LocalElasticAgent)  # type: ignore[misc]
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(self.keep)
        return True

    def _agent_class(self, base: Any) -> Any:
        recorder = self

        class RecordingAgent(base):  # type: ignore[misc, valid-type]
            def _monitor_workers(self, *args: Any, **kwargs: Any) -> Any:
                # torch's own call first; recording is best effort, so a torch whose agent
                # differs (another signature or result) loses the one line, never the run
                try:
                    spec = (args[0] if args else kwargs["worker_group"]).spec
                    left = getattr(self, "_remaining_restarts", 0)
                    recorder.attempt = spec.max_restarts - left  # as its workers count it
                except (AttributeError, KeyError, IndexError, TypeError):
                    pass
                result = super()._monitor_workers(*args, **kwargs)
                try:
                    if result.is_failed():
                        recorder.record({rank: failure.exitcode
                                         for rank, failure in result.failures.items()})
                except (AttributeError, TypeError, ValueError):
                    pass
                return result

        return RecordingAgent

    def record(self, exit_codes: dict[int, int]) -> None:
        path = _failures_file(self.folder, self.attempt)
        try:
            path.with_suffix(".tmp").write_text(json.dumps(
                {"exit_codes": {str(r): int(c) for r, c in exit_codes.items()}}),
                encoding="utf-8")
            os.replace(path.with_suffix(".tmp"), path)
        except OSError:
            pass

    def keep(self, record: logging.LogRecord) -> bool:
        """Whether torchrun's log line stays: not its SIGTERMs to the ranks left after a
        failure, nor its report of a rank killed by a signal or left after a peer."""
        msg = str(record.msg)
        if msg.startswith("Sending process"):
            return False
        if msg.startswith("failed (exitcode") and isinstance(record.args, tuple) \
                and len(record.args) >= 2:
            code, local_rank = record.args[0], record.args[1]
            if isinstance(code, int) and code < 0:
                return False
            if isinstance(local_rank, int) and _peer_lost_file(
                    self.folder, self.attempt, local_rank).exists():
                return False
        return True
