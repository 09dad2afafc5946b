"""rank_failures.py without processes: which errors are a peer's death, which rank died and how,
the line after a restart, the torchrun lines dropped, and the launcher's error when no restart
is left. The real 2-rank runs are tests/dist/test_rank_death.py and test_interrupts.py."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

import pytest

from autoplan.plan_files import save_plan
from autoplan.runtime.rank_failures import (
    FailureRecorder,
    leave_after_peer,
    peer_loss,
    read_failure,
    restart_line,
)
from tests.dist.parity import make_plan

GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
               "closed by peer [127.0.0.1]:24805. This is typically caused by a remote worker "
               "hanging or bugs in the application. GLHF!")
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:31147: Connection reset by peer")


def test_a_collective_failed_by_a_dead_peer_is_told_from_a_real_error():
    import torch.distributed as dist

    assert peer_loss(RuntimeError(GLOO_CLOSED)) == "Connection closed by peer"
    assert peer_loss(dist.DistBackendError(GLOO_RESET)) == "Connection reset by peer"
    try:  # wrapped: the cause carries it
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError as inner:
            raise RuntimeError("pipeline stage 1 failed") from inner
    except RuntimeError as outer:
        assert peer_loss(outer) == "Connection reset by peer"
    # a bug, bad input, a peer alive but stuck: not a peer's death
    assert peer_loss(ValueError("Connection reset by peer")) is None
    assert peer_loss(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert peer_loss(RuntimeError("[gloo] Timed out waiting 60000ms for recv operation")) is None


def test_a_checkpoint_save_failed_by_a_dead_peer_is_one_too():
    from torch.distributed.checkpoint.api import CheckpointException

    err = CheckpointException("save failed", {1: (RuntimeError(GLOO_CLOSED), None)})
    assert peer_loss(err) == "Connection closed by peer"
    assert peer_loss(CheckpointException("save failed", {1: (OSError("disk full"), None)})) is None


def _recorded(folder: Path, attempt: int, codes: dict[int, int], left: tuple[int, ...] = ()):
    (folder / f"failures.attempt{attempt}.json").write_text(json.dumps(
        {"exit_codes": {str(r): c for r, c in codes.items()}}))
    for rank in left:
        (folder / f"peer_lost.attempt{attempt}.rank{rank}").write_text("Connection reset by peer")


def test_the_rank_that_died_is_the_one_that_did_not_leave_after_a_peer(tmp_path, monkeypatch):
    # rank 2 killed; rank 0 and 1 failed their collective; rank 3 SIGTERMed by torchrun
    _recorded(tmp_path, 0, {0: 1, 1: 1, 2: -9, 3: -15}, left=(0, 1))
    failure = read_failure(str(tmp_path))
    assert failure is not None and failure.died == {2: -signal.SIGKILL} and failure.signalled
    assert failure.describe() == "rank 2 was killed by SIGKILL"
    # attempt 1: a rank raised (its traceback is shown); the last attempt is the one read
    _recorded(tmp_path, 1, {0: 1, 1: 1}, left=(0,))
    failure = read_failure(str(tmp_path))
    assert failure is not None and failure.attempt == 1 and not failure.signalled
    assert failure.describe() == "rank 1 exited with code 1 (its error is above)"
    # only torchrun's own SIGTERMs: no rank died, the collective's error is what is said, and
    # nothing claims a signal killed it
    _recorded(tmp_path, 2, {0: -15, 1: 1}, left=(1,))
    failure = read_failure(str(tmp_path))
    assert failure is not None and not failure.signalled
    assert failure.describe() == "no rank died, a collective failed: Connection reset by peer"
    (tmp_path / "peer_lost.attempt2.rank1").unlink()  # no marker text at all
    _recorded(tmp_path, 2, {0: -15}, left=())
    assert read_failure(str(tmp_path)).describe() == "a rank failed"
    assert read_failure(str(tmp_path / "nothing-here")) is None


def test_rank_0_says_who_died_and_where_every_rank_resumes(tmp_path, monkeypatch):
    _recorded(tmp_path, 0, {0: 1, 1: -9}, left=(0,))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    assert restart_line(str(tmp_path), 10, "ck") == (
        "restart 1 of 2: rank 1 was killed by SIGKILL; every rank resumes from checkpoint "
        "step 10")
    assert restart_line(str(tmp_path), 0, "ck").endswith(
        "every rank starts over at step 0 (no checkpoint was saved before it)")
    # another launcher (no folder): no record, still one line
    assert restart_line(None, 0, None) == (
        "restart 1 of 2: a rank failed; every rank starts over at step 0 (no --checkpoint-dir)")


def test_a_connection_reset_between_live_ranks_is_quoted(tmp_path, monkeypatch):
    """Every rank's collective failed and none died (a network reset between live hosts): the
    gloo line, address and operation, reaches the launcher instead of 'a rank failed'
    (review)."""
    from autoplan.runtime.rank_failures import peer_loss_line

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    wrapped = RuntimeError("pipeline stage failed\n" + GLOO_RESET)
    assert peer_loss_line(wrapped) == GLOO_RESET
    for rank in (0, 1):
        leave_after_peer(str(tmp_path), rank, "Connection reset by peer", f"x\n{GLOO_RESET}")
    _recorded_codes_only(tmp_path, 0, {0: 1, 1: 1})
    failure = read_failure(str(tmp_path))
    assert failure is not None and failure.died == {}
    assert failure.describe() == f"no rank died, a collective failed: {GLOO_RESET}"


def _recorded_codes_only(folder: Path, attempt: int, codes: dict[int, int]) -> None:
    (folder / f"failures.attempt{attempt}.json").write_text(json.dumps(
        {"exit_codes": {str(r): c for r, c in codes.items()}}))


def test_a_surviving_rank_marks_itself_or_says_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert leave_after_peer(str(tmp_path), 2, "Connection closed by peer") == 1
    assert (tmp_path / "peer_lost.attempt3.rank2").is_file() and capsys.readouterr().err == ""
    assert leave_after_peer(None, 2, "Connection closed by peer") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[rank2] autoplan: a collective failed "
                                                   "(Connection closed by peer)")


@pytest.mark.parametrize("limit, count, then", [
    ("3", "1", "exiting 1 for the launcher to restart the job (2 of --max-restarts 3 left)"),
    ("2", "1", "exiting 1 for the launcher to restart the job (1 of --max-restarts 2 left)"),
    ("0", "0", "exiting 1; no restart is left (--max-restarts 0), so the job ends"),
    ("2", "2", "exiting 1; no restart is left (--max-restarts 2), so the job ends"),
    (None, None, "exiting 1"),  # not under torchrun: nothing to promise
])
def test_the_line_promises_a_restart_only_when_one_is_left(monkeypatch, capsys, limit, count,
                                                           then):
    """Under --max-restarts 0 the line said 'for the launcher to restart the job', and none
    came (review)."""
    for name, value in (("TORCHELASTIC_MAX_RESTARTS", limit),
                        ("TORCHELASTIC_RESTART_COUNT", count)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert leave_after_peer(None, 1, "Connection closed by peer") == 1
    assert capsys.readouterr().err == ("[rank1] autoplan: a collective failed (Connection "
                                       f"closed by peer): another rank is gone; {then}\n")


def _log(msg: str, *args) -> logging.LogRecord:
    return logging.LogRecord("torch.distributed.elastic.multiprocessing.api", logging.ERROR,
                             __file__, 1, msg, args, None)


def test_torchruns_lines_about_a_death_are_dropped_and_a_crash_kept(tmp_path):
    rec = FailureRecorder(str(tmp_path))
    failed = "failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s"
    assert not rec.keep(_log("Sending process %s closing signal %s", 123, "SIGTERM"))
    assert not rec.keep(_log(failed, -9, 1, 123, "python"))  # the restart line names it
    assert rec.keep(_log(failed, 1, 1, 123, "python"))  # a crash: kept
    (tmp_path / "peer_lost.attempt0.rank1").write_text("")
    assert not rec.keep(_log(failed, 1, 1, 123, "python"))  # it left after a peer
    assert rec.keep(_log("some other line %s", 1))


def test_the_recorder_writes_what_read_failure_reads(tmp_path):
    rec = FailureRecorder(str(tmp_path))
    rec.attempt = 2
    rec.record({0: 1, 1: -11})
    (tmp_path / "peer_lost.attempt2.rank0").write_text("")
    failure = read_failure(str(tmp_path))
    assert failure is not None and failure.attempt == 2
    assert failure.describe() == "rank 1 was killed by SIGSEGV"


def test_the_recording_agent_is_what_torchrun_builds():
    """quiet_torchrun's hook: torch's launcher builds LocalElasticAgent by that module name."""
    import torch.distributed.launcher.api as launcher
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    assert launcher.LocalElasticAgent is LocalElasticAgent
    agent = FailureRecorder("/nonexistent")._agent_class(LocalElasticAgent)
    assert issubclass(agent, LocalElasticAgent) and "_monitor_workers" in vars(agent)


def test_the_launcher_says_the_death_in_one_line_when_no_restart_is_left(tmp_path, capsys,
                                                                         monkeypatch):
    from autoplan.commands import main
    from autoplan.runtime.supervise import Outcome

    plan = str(save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml"))

    def a_rank_killed(cmd, *_args, **_kwargs):
        folder = Path(cmd[cmd.index("--summary-file") + 1]).parent
        _recorded(folder, 0, {0: 1, 1: -9}, left=(0,))
        return Outcome(returncode=1)

    monkeypatch.setattr("autoplan.runtime.supervise.run_supervised", a_rank_killed)
    code = main(["train", plan, "--steps", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err == [
        "autoplan train: error: rank 1 was killed by SIGKILL, and no restart is left "
        "(--max-restarts 0); no --checkpoint-dir: nothing saved"], err


@pytest.fixture(autouse=True)
def _no_torchelastic_env(monkeypatch):
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(name, raising=False)
