"""One rank of a training job: process group, mesh, parallelize, data, steps, checkpoints.

Runs under torchrun (or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR/PORT). A rank that
gets SIGTERM or SIGINT, sees the CLI's stop file, or finds the CLI gone, finishes its step; all
ranks agree through the step's loss all-reduce, save a checkpoint and leave quietly. After a
torchrun restart (TORCHELASTIC_RESTART_COUNT > 0) ranks resume from the newest intact
checkpoint, and the metrics file drops the records past it; ranks whose collective failed
because another rank died leave without a traceback and rank 0 of the next attempt says which
rank died and the step it resumes from (rank_failures.py). With --elastic, rank 0 re-plans
for the WORLD_SIZE present (elastic.py) and every rank runs that plan; ranks it leaves out wait
idle, and the others always resume from the newest checkpoint (DCP reshards it).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from autoplan.errors import ConfigError
from autoplan.runtime.mesh import ParallelDims, build_mesh, dp_rank, pg_timeout
from autoplan.runtime.supervise import pid_alive

log = logging.getLogger("autoplan.runtime.worker")  # its name under `python -m` too, not __main__


def _setup_logging(rank: int) -> None:
    level = logging.INFO if rank == 0 else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"[rank{rank}] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def _job_store(rank: int, present: int, timeout_s: float, elastic: bool) -> dist.Store:
    """The job's TCPStore, its keys prefixed by the torchrun attempt and the world size.

    torch 2.13's env:// rendezvous reuses the agent's store across torchrun restarts without a
    per-attempt prefix, so restarted gloo ranks read the dead ranks' addresses ("Gloo
    connectFullMesh failed ... Connection refused"); the prefix keeps attempts apart. An
    elastic job cannot use it: a membership change restarts some agents' workers without
    counting a restart, so ranks of one round disagree on the attempt. Its agents do not share
    their store (launch.ELASTIC_ENV): rank 0 of every round hosts a new one on a new port.
    """
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if elastic and agent_store:
        raise ConfigError("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "unset under --elastic (torchrun"
                          " then shares a store whose address goes stale when a node dies)",
                          "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun (`autoplan "
                          "train` and `autoplan export --elastic` do)")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), present,
        is_master=(not agent_store and rank == 0), timeout=pg_timeout(timeout_s),
        multi_tenant=not agent_store,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"autoplan/attempt-{attempt}" if agent_store else "autoplan"
    return dist.PrefixStore(f"{prefix}/world-{present}", store)


def _init_process_group(backend: str, rank: int, world: int, timeout_s: float,
                        store: dist.Store) -> None:
    """init_process_group of `world` ranks on the job's store (an elastic re-plan may use
    fewer ranks than are present: those sit idle and never join)."""
    timeout = pg_timeout(timeout_s)
    # with NCCL, gloo carries the collectives of CPU tensors (loss and flag all-reduces), as
    # torchtitan initialises its process group
    backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else backend
    dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                            world_size=world, timeout=timeout)


STOP_FILE_REASON = "the launcher's stop file"
"""The summary's stopped_early when `autoplan train` asked the ranks to stop (it got a signal,
and replaces this with the signal's name)."""


class _StopFlag:
    """Whether this rank wants the job to stop after the current step, and why (`reason`)."""

    def __init__(self, stop_file: str | None = None, launcher_pid: int | None = None) -> None:
        self.signum: int | None = None
        self.reason: str | None = None
        self.stop_file, self.launcher_pid = stop_file, launcher_pid
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        # nothing logged here (a handler that logs can deadlock on logging's lock), nor said
        # before the step ends: torchrun SIGTERMs the ranks left after one died, and those
        # never finish their step (rank_failures.py says what happened)
        if self.signum is None:
            self.signum = signum

    @property
    def set(self) -> bool:
        if self.reason is None:
            self.reason = self._why()
        return self.reason is not None

    def _why(self) -> str | None:
        if self.signum is not None:
            return signal.Signals(self.signum).name
        if self.stop_file and os.path.exists(self.stop_file):
            return STOP_FILE_REASON
        if self.launcher_pid is not None and not pid_alive(self.launcher_pid):
            return "the launcher's exit"
        return None


def run(args: argparse.Namespace) -> dict | None:
    """Train; returns the summary on rank 0 (None elsewhere)."""
    from autoplan.runtime.checkpoint import Checkpointer
    from autoplan.runtime.checkpoint_compat import RunSettings, checkpoint_meta
    from autoplan.runtime.data import local_batch, make_source
    from autoplan.runtime.launch import preflight
    from autoplan.runtime.machine import device_mismatch, host_load, load_average, machine_info
    from autoplan.runtime.metrics import MetricsSink, StepMetrics, TrainingPeak, job_peak
    from autoplan.runtime.optim import OptimConfig
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.rank_failures import attempt
    from autoplan.runtime.summary import summarize
    from autoplan.runtime.train_args import under_restart
    from autoplan.runtime.trainer import Trainer

    rank, present = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    load_start = load_average()  # before this rank's start-up adds to it
    _setup_logging(rank)
    stop = _StopFlag(args.stop_file, args.launcher_pid)  # before the slow start-up
    if args.elastic:
        from autoplan.runtime.resume import elastic_trained_already

        if _say_done(elastic_trained_already(args), rank):  # before the store and re-plan
            return None
    store = _job_store(rank, present, args.pg_timeout_s, args.elastic)
    chosen = None
    if args.elastic:
        from autoplan.runtime.elastic import agree_on_plan, wait_idle

        chosen = agree_on_plan(store, rank, present, args)
        if rank >= chosen.world_size:
            wait_idle(store, rank, chosen, lambda: stop.set)
            return None
    world = chosen.world_size if chosen is not None else present
    plan, spec, backend = preflight(args, world, chosen.plan if chosen is not None else None,
                                    check_data=False)
    source = make_source(args.data, spec.vocab_size, spec.seq_len, args.seed)  # read once
    if _trained_already(args, plan, spec, source, rank):
        return None
    args.effective_plan = plan  # what run_and_report writes into the run record
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    machine = machine_info(device, backend)
    mismatch = device_mismatch(plan.cluster.profile, machine) if rank == 0 else None
    if mismatch:
        log.warning("%s", mismatch)
    _init_process_group(backend, rank, world, args.pg_timeout_s, store)
    dims = ParallelDims.from_plan(plan)
    mesh = build_mesh(dims, device.type)
    pm = parallelize(plan, spec, mesh, device,
                     RuntimeOptions(seed=args.seed, dropout=args.dropout,
                                    pg_timeout_s=args.pg_timeout_s))
    trainer = Trainer(pm, OptimConfig(name=args.optimizer, lr=args.lr,
                                      max_grad_norm=args.max_grad_norm), seed=args.seed,
                      reseed=args.dropout > 0)
    settings = RunSettings.of(args, plan, trainer.optim_cfg.weight_decay,
                              data_fingerprint=getattr(source, "fingerprint", None))
    ckpt = Checkpointer(args.checkpoint_dir, pm.parts, trainer.optimizers,
                        tied=pm.tie_embeddings, loss_scaler=pm.loss_scaler,
                        keep=args.keep_checkpoints) if args.checkpoint_dir else None
    resumed_by = _resume(ckpt, trainer, plan, spec, settings, args) if ckpt is not None else None
    resumed = trainer.step
    if rank == 0 and under_restart():
        from autoplan.runtime.rank_failures import restart_line

        folder = os.path.dirname(args.summary_file) if args.summary_file else None
        log.warning("%s", restart_line(folder, resumed, args.checkpoint_dir))
    sink = MetricsSink(args.metrics_file, live=True, resumed_step=resumed,
                       warn_gap=not under_restart()) if rank == 0 else None
    meta = {"plan": os.path.basename(args.plan), **checkpoint_meta(plan, spec, world, settings)}
    gbs = plan.batch.global_batch_size
    tokens_per_step = gbs * spec.seq_len
    my_dp = dp_rank(mesh, dims)
    peak = TrainingPeak(device)
    stopped_early = None
    while trainer.step < args.steps:
        peak.start_step()
        t0 = time.perf_counter()
        x, y = local_batch(source, trainer.step + 1, gbs, dims.dp, my_dp)
        res = trainer.train_step(x.to(device), y.to(device), stop_flag=lambda: stop.set)
        dt = time.perf_counter() - t0
        step_peak = peak.end_step()  # before a save: the save's memory is no training's
        if sink is not None:
            norm = res.grad_norm if math.isfinite(res.grad_norm) else None
            sink.record(StepMetrics(res.step, res.loss, dt, tokens_per_step / dt, step_peak,
                                    norm, res.loss_scale, res.skipped))
        every = args.checkpoint_every
        if ckpt is not None and (res.stop_requested or (every and res.step % every == 0)
                                 or res.step == args.steps):
            ckpt.save(res.step, {**meta, "consumed_samples": res.step * gbs})
            peak.saved()
        if res.stop_requested:
            stopped_early = stop.reason or "another rank"  # the ranks agree in the step
            if rank == 0 and res.step < args.steps:  # a stop in the last step stops nothing
                log.warning("stopped after step %d", res.step)
            break
    largest = job_peak(peak.bytes)  # every rank: the cost model prices the largest
    machine = {**machine, **host_load(load_start, load_average())}
    summary = summarize(sink.history, plan, resumed_step=resumed, peak=largest,
                        machine=machine, device_mismatch=mismatch, resumed_by=resumed_by,
                        restarts=attempt(), stopped_early=stopped_early, steps=args.steps,
                        checkpointed=ckpt is not None) if sink is not None else None
    del trainer, pm, ckpt  # free reducers and FSDP state before the process group goes
    dist.barrier()
    if chosen is not None and rank == 0:
        from autoplan.runtime.elastic import release_idle

        release_idle(store, chosen)
    dist.destroy_process_group()
    return summary


def _trained_already(args: argparse.Namespace, plan, spec, source, rank: int) -> bool:
    """A job's launch with --resume over a checkpoint at --steps (resubmitted, requeued or
    chained after it ended; no launcher checked it) trains nothing: every rank reads the shared
    checkpoint folder before it builds anything (resume.check_resume, which also refuses what
    the launcher refuses), rank 0 says it, and every rank exits 0 having written nothing, so the
    job's script ends on torchrun's 0 (no saved-step file). Not in a restart (_resume ends one
    at --steps) nor under --elastic (resume.elastic_trained_already decided before the store)."""
    from autoplan.runtime.resume import check_resume
    from autoplan.runtime.train_args import under_restart

    if not args.resume or args.elastic or under_restart():
        return False
    return _say_done(check_resume(args, plan, spec, getattr(source, "fingerprint", None)), rank)


def _say_done(done: str | None, rank: int) -> bool:
    """Rank 0 says a finished run's line as the launcher says it (launch_and_report)."""
    if done is not None and rank == 0:
        sys.stderr.write(f"autoplan train: {done}\n")
    return done is not None


def _resume(ckpt, trainer, plan, spec, settings, args: argparse.Namespace) -> str | None:
    """With --resume, after a torchrun restart or under --elastic: continue from the newest
    checkpoint, with this run's lr and weight decay (the loaded optimizer state brings the
    saving run's). A restart or an elastic start may find none and start at step 0; --resume
    may not, and ends at --steps with nothing to do (the launcher, or _trained_already where a
    scheduler started the ranks, decided both already). A checkpoint past --steps is always
    refused: no attempt of this run saves past its --steps, so it is another run's, and the
    restart that follows the first attempt's refusal would train nothing and exit 0. One at
    --steps ends a restart or an elastic round quietly: an attempt saved the last step, and
    the run is done. Returns what loaded a checkpoint (summary.RESUMED_BY: a restart before
    --elastic before --resume), None when none was."""
    from autoplan.runtime.checkpoint_compat import check_steps
    from autoplan.runtime.optim import set_hyperparameters
    from autoplan.runtime.resume import check_fresh_start
    from autoplan.runtime.train_args import under_restart

    restarted = under_restart()
    if not (args.resume or restarted or args.elastic):
        return None
    step = ckpt.load_newest(plan, spec, settings)
    asked = args.resume and not restarted and not args.elastic
    if step is None:
        if asked:
            check_fresh_start(args)
            if dist.get_rank() == 0:
                log.warning("--resume: no checkpoint in %s; starting at step 0",
                            args.checkpoint_dir)
        return None
    if asked or step > args.steps:
        check_steps(step, args.steps)
    trainer.step = step
    set_hyperparameters(trainer.optimizers, trainer.optim_cfg)
    return "restart" if restarted else "elastic" if args.elastic else "--resume"


def run_and_report(args: argparse.Namespace) -> int:
    """In place under a launcher: rank 0 prints the summary (or writes --summary-file). A rank
    whose collective failed because another rank died leaves without a traceback (exit 1)."""
    from autoplan.cli_common import emit
    from autoplan.errors import AutoplanError
    from autoplan.runtime.rank_failures import leave_after_peer, peer_loss, peer_loss_line
    from autoplan.runtime.summary import render_summary

    try:
        summary = run(args)
    except (AutoplanError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # dcp's CheckpointException is no Exception
        phrase = peer_loss(err)
        if phrase is None:
            raise
        folder = os.path.dirname(args.summary_file) if args.summary_file else None
        return leave_after_peer(folder, int(os.environ.get("RANK", "0") or 0), phrase,
                                peer_loss_line(err))
    if summary is not None:
        _write_saved_step(summary, args)  # first: what follows may fail, the save stands
        if args.run_record and not args.summary_file:  # under a scheduler: no CLI to write it
            from autoplan.plan_files import load_plan
            from autoplan.runtime.summary import write_run_record

            plan = getattr(args, "effective_plan", None) or load_plan(args.plan)
            write_run_record(args.run_record, summary, plan)
        if args.summary_file:
            with open(args.summary_file, "w", encoding="utf-8") as f:
                json.dump(summary, f)
        else:
            emit(args, summary, lambda console: render_summary(console, summary))
    return 0


def _write_saved_step(summary: dict, args: argparse.Namespace) -> None:
    """Rank 0, once the run ended cleanly: the step of its last checkpoint, which every rank
    has saved (the loop saves the step it ends on), to the file an exported SLURM job names in
    checkpoint_names.SAVED_STEP_ENV, written whole (renamed into place; a write cut short
    leaves no `.tmp` beside it). torchrun exits 1 once it has passed a SIGTERM on, whatever
    its ranks did; the job's script reads this instead."""
    from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV

    path, step = os.environ.get(SAVED_STEP_ENV), summary.get("final_step")
    if not path or not args.checkpoint_dir or step is None:
        return
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{step}\n")
        os.replace(tmp, path)
    except OSError as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass  # never written (the folder is gone or read-only): nothing to remove
        log.warning("%s: cannot write %s (%s): the job script cannot tell this clean end from a crash",
                    SAVED_STEP_ENV, path, err.strerror or err)


def main(argv: list[str] | None = None) -> int:
    from autoplan.errors import AutoplanError
    from autoplan.runtime.cli import add_train_arguments

    parser = argparse.ArgumentParser(prog="autoplan-train-worker", allow_abbrev=False)
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    if args.summary_file:  # under `autoplan train`: the launcher reads only this attempt's refusals
        from autoplan.runtime.rank_errors import mark_attempt

        mark_attempt(os.path.dirname(args.summary_file))
    try:
        return run_and_report(args)
    except AutoplanError as err:
        if not _tell_launcher(args, err):
            print(f"autoplan: error: {err}", file=sys.stderr)
        return err.exit_code
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # a real error (a peer's death run_and_report handled)
        sys.excepthook(type(err), err, err.__traceback__)  # as Python prints it ([rankN]: ...),
        return 1  # then os._exit: teardown can hang after gloo, and torchrun's SIGTERM to
        # the hung rank would read as the cause (rank_failures.read_failure)


def _tell_launcher(args: argparse.Namespace, err) -> bool:
    """Under `autoplan train` (--summary-file in its temporary folder): hand the refusal to
    the launcher, which says it in one line with its exit code (rank_errors.read_rank_error)."""
    if not args.summary_file:
        return False
    from autoplan.runtime.rank_errors import write_rank_error

    return write_rank_error(os.path.dirname(args.summary_file),
                            int(os.environ.get("RANK", "0") or 0), err)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown, which can hang after gloo (see the notes)
