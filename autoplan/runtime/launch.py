"""Local launch: validate every flag and the plan, then run torchrun as a subprocess (list args,
no shell) under a supervisor that stops it cleanly on Ctrl-C/SIGTERM (supervise.py).

Every user mistake (a flag's value, world size, plan invalid for the model, NCCL without CUDA,
a checkpoint that cannot resume this plan) is one ConfigError raised here, before any process
starts; a plan the cost model says does not fit in memory, on its profile's devices or on this
host (CPU ranks share its memory), is refused (exit 3) unless --no-memory-check, as are more
NCCL ranks than this node has GPUs. torchrun restarts all ranks up to --max-restarts times
after a failure; restarted ranks resume from the newest intact checkpoint. With --elastic the
launcher re-plans for --nproc first (exit 3 when nothing fits) and the ranks re-plan again
whenever torchrun restarts them on another world size (one machine has one torchrun agent; a
multi-node job runs one per node, see export).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from autoplan.errors import AutoplanError, ConfigError, InfeasiblePlanError, RuntimeLaunchError
from autoplan.runtime.rank_errors import read_rank_error
from autoplan.runtime.rank_failures import read_failure

log = logging.getLogger(__name__)


class TrainingInterrupted(AutoplanError):
    """Stopped by SIGINT (exit 130) or SIGTERM (exit 143), after checkpointing if asked."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


def resolve_backend(requested: str) -> str:
    import torch

    cuda = torch.cuda.is_available()
    if requested == "nccl" and not cuda:
        raise ConfigError("--backend", "nccl needs CUDA, which this machine does not have",
                          "use --backend gloo (or auto)")
    if requested == "auto":
        return "nccl" if cuda else "gloo"
    return requested


def preflight(args: argparse.Namespace, world_size: int, plan=None, *, check_data: bool = True):
    """Load (or take, e.g. an elastic re-plan) and check the plan for `world_size` processes;
    returns (plan, spec, backend). `check_data=False` leaves --data to the caller (a rank
    reads it once, into its source; the launcher scans it once: data_preflight)."""
    from autoplan.plan_files import load_plan
    from autoplan.runtime.train_args import check_train_args
    from autoplan.runtime.validation import check_plan

    check_train_args(args)
    plan = run_dropout(args, plan if plan is not None else load_plan(args.plan))
    spec = plan.model_spec()
    check_plan(plan, spec, world_size)
    if check_data:
        data_preflight(args, spec)
    return plan, spec, resolve_backend(args.backend)


def data_preflight(args: argparse.Namespace, spec) -> dict | None:
    """Check --data as the ranks will read it, streamed (no copy of the corpus held here);
    returns its fingerprint (files, sizes, SHA-256), None for synthetic tokens."""
    data = getattr(args, "data", None)
    if data is None:
        return None
    from autoplan.runtime.data import check_byte_vocab, scan_corpus

    check_byte_vocab(spec.vocab_size)
    return scan_corpus(data, spec.seq_len)


def run_dropout(args: argparse.Namespace, plan):
    """The plan as it will run: its model's dropout (model.dropout, which the cost model prices)
    unless --dropout sets another, which then replaces it, so every check and prediction prices
    the dropout the ranks apply. Sets args.dropout to that rate (the workers get it)."""
    spec = plan.model_spec()
    if args.dropout is None:
        args.dropout = spec.dropout
        return plan
    if args.dropout == spec.dropout:
        return plan
    return plan.replace(model=spec.replace(dropout=args.dropout))


def memory_preflight(args: argparse.Namespace, plan, spec) -> None:
    """Refuse (exit 3) a plan the cost model says does not fit, priced as `autoplan estimate`
    prices it by default: autoplan's own runtime on the plan's profile's device. Only the
    launcher checks (ranks started by a scheduler train what they are given); a profile that
    cannot be loaded here is an error (exit 2, load_cluster). --no-memory-check skips it."""
    from autoplan.cost.estimate import memory_misses
    from autoplan.runtime.validation import load_cluster

    if getattr(args, "no_memory_check", False):
        return
    cluster = load_cluster(plan)
    est, misses = memory_misses(plan, cluster, spec)  # check_plan passed: memory only
    if misses:
        raise InfeasiblePlanError(
            f"plan {args.plan} does not fit {cluster.num_gpus} x {plan.cluster.profile} as "
            f"{est.runtime} runs it: {'; '.join(misses)}; choose a plan that fits (`autoplan "
            "search`), or pass --no-memory-check to launch anyway")


CPU_PROFILE = "cpu-gloo"
"""Whose per-rank reserve (torch's own RSS) prices a rank of a GPU profile's plan on a CPU."""


def host_preflight(args: argparse.Namespace, plan, spec, nproc: int, backend: str) -> None:
    """Refuse (exit 3) a launch this host cannot hold, whatever the plan's profile promises
    (memory_preflight prices the plan on that profile's devices, not on this host). With NCCL:
    more ranks than this node has CUDA GPUs (the launcher runs one node, --standalone). On CPU
    (gloo): ranks whose memory, priced as autoplan's CPU runtime holds it, adds up to more
    than the host memory they all share. A plan of another device that fits still trains here,
    with the ranks' warning (machine.device_mismatch). --no-memory-check skips the memory part."""
    from autoplan.cost.estimate import short_by
    from autoplan.runtime.machine import host_memory_bytes, local_gpu_count

    if backend == "nccl":
        gpus = local_gpu_count()
        if nproc > gpus:
            raise InfeasiblePlanError(
                f"plan {args.plan} needs {nproc} ranks, one per GPU, but this node has {gpus} "
                f"CUDA GPU(s) (short by {nproc - gpus}); run it across nodes (`autoplan "
                "export`), or choose a plan for this node (`autoplan search --num-gpus "
                f"{gpus}`)")
        return
    if getattr(args, "no_memory_check", False):
        return
    need, per_rank = cpu_ranks_bytes(plan, spec, nproc)
    have = host_memory_bytes()
    if need > have:
        raise InfeasiblePlanError(
            f"plan {args.plan} does not fit this host: {nproc} ranks on cpu ({backend}) need "
            f"{need / 2**30:.1f} GiB as autoplan-cpu holds them ({per_rank / 2**30:.2f} GiB per "
            f"rank), this host has {have / 2**30:.1f} GiB (short by {short_by(need - have)}); "
            f"train it on the {plan.cluster.profile} GPUs it was planned for (`autoplan "
            f"export`), choose a plan for this host (`autoplan search --cluster {CPU_PROFILE}`),"
            " or pass --no-memory-check to launch anyway")


def cpu_ranks_bytes(plan, spec, nproc: int) -> tuple[float, float]:
    """(bytes all `nproc` CPU ranks hold together, bytes of one training rank): the plan priced
    as autoplan-cpu runs it on the plan's cluster, the device's reserve replaced by a CPU
    rank's (a CPU profile's own, else cpu-gloo's: torch's RSS), offloaded states added (they
    are host memory too). Ranks an elastic re-plan leaves idle hold only the reserve."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.hardware import load_profile
    from autoplan.runtime.validation import load_cluster

    cluster = load_cluster(plan)
    cpu = cluster.profile if cluster.profile.is_cpu else load_profile(CPU_PROFILE)
    reserve = float(cpu.device.reserved_bytes)
    mem = estimate_plan(plan, cluster, spec, runtime="autoplan-cpu").memory
    per_rank = mem["total"] - mem["reserved"] + reserve + mem["host_total"]
    idle = max(0, nproc - plan.world_size)
    return per_rank * min(nproc, plan.world_size) + reserve * idle, per_rank


def worker_argv(args: argparse.Namespace, summary_file: str) -> list[str]:
    """The worker's command-line arguments (the same parser as `autoplan train`)."""
    out = [str(Path(args.plan).resolve()), "--steps", str(args.steps), "--optimizer",
           args.optimizer, "--lr", repr(args.lr), "--max-grad-norm", repr(args.max_grad_norm),
           "--seed", str(args.seed), "--dropout", repr(args.dropout), "--backend", args.backend,
           "--pg-timeout-s", repr(args.pg_timeout_s), "--checkpoint-every",
           str(args.checkpoint_every), "--keep-checkpoints", str(args.keep_checkpoints),
           "--summary-file", summary_file, "--stop-file", stop_file_for(summary_file),
           "--launcher-pid", str(os.getpid()), "--format", "json"]
    for flag, value in (("--data", args.data), ("--checkpoint-dir", args.checkpoint_dir),
                        ("--metrics-file", args.metrics_file)):
        if value is not None:
            out += [flag, str(Path(value).resolve())]
    if args.resume:
        out.append("--resume")
    if getattr(args, "elastic", False):
        from autoplan.runtime.elastic import elastic_space

        out += ["--elastic", "--space", elastic_space(args)]
        if args.min_gpus is not None:
            out += ["--min-gpus", str(args.min_gpus)]
    return out


def stop_file_for(summary_file: str) -> str:
    return os.path.join(os.path.dirname(summary_file), "stop")


ELASTIC_RESTARTS = 3
"""torchrun --max-restarts of an --elastic job when --max-restarts is 0."""
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""torch 2.13's c10d rendezvous shares one TCPStore, hosted by the agent that was rank 0 in the
first round, with the workers; a node that was rank 1+ keeps that address in later rounds
(dynamic_rendezvous.py: the bootstrap info is rebuilt only for a new rank 0), so when the first
rank-0 node dies the survivors' workers cannot reach a store. Unshared, rank 0 of every round
hosts a fresh store for its workers (worker._job_store)."""


def torchrun_command(nproc: int, max_restarts: int, argv: list[str],
                     errors: str | None = None) -> list[str]:
    """torchrun running the worker; with `errors` (the folder the ranks write a refusal to,
    rank_errors.rank_error_file) through rank_errors.quiet_torchrun, which leaves torchrun's
    traceback out when a rank refused (the launcher says the refusal in one line)."""
    torchrun = ["--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
                "-m", "autoplan.runtime.worker", *argv]
    if errors is None:
        return [sys.executable, "-m", "torch.distributed.run", *torchrun]
    return [sys.executable, "-c", "import sys; from autoplan.runtime.rank_errors import "
            "quiet_torchrun; sys.exit(quiet_torchrun(sys.argv[1:]))", errors, *torchrun]


def launch_and_report(args: argparse.Namespace) -> int:
    """Validate, run torchrun, and print the summary rank 0 wrote (table, json or yaml); after
    a Ctrl-C or SIGTERM too, where the ranks stopped cleanly (stopped_early names the signal),
    before the exit code says it. Killed ranks write no summary: then only the error line."""
    from autoplan.cli_common import emit
    from autoplan.plan_files import load_plan
    from autoplan.runtime.checkpoint_files import clean_temporaries
    from autoplan.runtime.resume import resume_preflight
    from autoplan.runtime.supervise import run_supervised
    from autoplan.runtime.train_args import check_train_args
    from autoplan.runtime.validation import load_cluster

    check_train_args(args)
    given = load_plan(args.plan)
    load_cluster(given)  # the profile every check and the prediction price the plan on
    nproc = args.nproc if args.nproc is not None else given.world_size
    chosen = None
    if args.elastic:  # fail now (exit 3) if no plan fits; rank 0 re-plans again and says it
        from autoplan.runtime.elastic import elastic_space, replan

        chosen = replan(given, nproc, space=elastic_space(args),
                        min_world=args.min_gpus or 1).plan
    plan, spec, backend = preflight(args, chosen.world_size if chosen else nproc, chosen,
                                    check_data=False)
    fingerprint = data_preflight(args, spec)
    memory_preflight(args, plan, spec)
    host_preflight(args, plan, spec, nproc, backend)
    done = resume_preflight(args, plan, spec, fingerprint)
    if done is not None:  # a run trained already (a job started again): nothing to launch
        sys.stderr.write(f"autoplan train: {done}\n")
        return 0
    restarts = args.max_restarts or (ELASTIC_RESTARTS if args.elastic else 0)
    with tempfile.TemporaryDirectory(prefix="autoplan-train-") as tmp:
        summary_file = os.path.join(tmp, "summary.json")
        cmd = torchrun_command(nproc, restarts, worker_argv(args, summary_file), errors=tmp)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        if args.elastic:
            env.update(ELASTIC_ENV)
        log.info("launching: %s", " ".join(cmd))
        outcome = run_supervised(cmd, env, stop_file_for(summary_file),
                                 grace_s=args.pg_timeout_s + 60.0)
        if args.checkpoint_dir:
            clean_temporaries(args.checkpoint_dir)  # a save cut short by a kill
        summary = None
        if outcome.returncode == 0 and os.path.exists(summary_file):
            summary = json.loads(Path(summary_file).read_text())
        refusal = read_rank_error(tmp) if summary is None else None
        failure = read_failure(tmp) if summary is None else None
    if outcome.signal is not None:
        if summary is not None:  # the ranks stopped cleanly: what they trained, said as usual
            if summary.get("stopped_early"):  # none: the signal came as the last step ran
                summary["stopped_early"] = signal.Signals(outcome.signal).name
            emit(args, with_profile(summary, plan),
                 lambda console: render(console, summary, plan.cluster.profile))
            if args.run_record:  # the steps trained were measured: calibrate reads them
                _write_record(args.run_record, summary, plan)
        elif args.run_record:
            log.warning("--run-record %s not written: the ranks were stopped before they "
                        "summed up the run", args.run_record)
        finished = _finished(outcome, summary, args)
        if finished is not None:  # no error: the signal's exit code, and a line on the run
            sys.stderr.write(f"autoplan train: warning: {finished}\n")
            return 128 + outcome.signal
        raise TrainingInterrupted(outcome.signal, _interrupted(outcome, summary, args))
    if refusal is not None:
        raise refusal
    if summary is None and failure is not None:
        raise RuntimeLaunchError(f"{failure.describe()}, and no restart is left (--max-restarts "
                                 f"{restarts}); {_saved(args)}")
    if summary is None:
        raise RuntimeLaunchError(f"torchrun exited with code {outcome.returncode}; see the "
                                 "rank logs above")
    emit(args, with_profile(summary, plan),
         lambda console: render(console, summary, plan.cluster.profile))
    if args.run_record:  # after the summary: a path taken meanwhile costs no result
        _write_record(args.run_record, summary, plan)
    return 0


def _write_record(path: str, summary: dict, plan) -> None:
    """Write the run record, saying so where it holds no measured step (a run stopped, or
    ended, within its warm-up): its measured.step_time_s is null, which `autoplan calibrate`
    refuses, so the record is no calibration point until a run measures a step."""
    from autoplan.runtime.summary import write_run_record

    written = write_run_record(path, summary, plan)
    if summary.get("measured", {}).get("step_time_s") is None:
        log.warning("--run-record %s holds no measured step (measured.step_time_s is null: "
                    "the run trained no step after its warm-up), so `autoplan calibrate` "
                    "refuses it; a run that measures one makes a record it reads", written)


def with_profile(summary: dict, plan) -> dict:
    """The summary with the profile its prediction was priced on beside the runtime
    (`predicted.profile`: a name, or the file read), as the run record names it: a user's
    edited copy of a shipped profile priced the same device unsaid."""
    if isinstance(summary.get("predicted"), dict):
        summary["predicted"]["profile"] = plan.cluster.profile
    return summary


def render(console, summary: dict, profile: str) -> None:
    """The summary's table, then the runtime and profile the prediction was priced for."""
    from autoplan.runtime.summary import render_summary

    render_summary(console, summary)
    runtime = (summary.get("predicted") or {}).get("runtime")
    console.print(f"predicted for runtime {runtime} on profile {profile}" if runtime
                  else f"profile {profile} (no prediction)", markup=False)


def _finished(outcome, summary: dict | None, args: argparse.Namespace) -> str | None:
    """What the run did when the signal came as its last step of --steps ran: that step
    finished (and was saved), so nothing stopped; None for a run the signal stopped."""
    from autoplan.runtime.checkpoint_names import step_dir

    if outcome.killed or summary is None or summary.get("stopped_early"):
        return None
    step = summary.get("final_step")
    if step is None:
        return None
    name = signal.Signals(outcome.signal).name
    saved = (f"; checkpoint {step_dir(step)} saved in {args.checkpoint_dir}, nothing left to "
             "resume" if args.checkpoint_dir else " (no --checkpoint-dir: nothing saved)")
    return (f"{name} came as the run ended: step {step}, the last of --steps {args.steps}, "
            f"finished{saved}")


def _interrupted(outcome, summary: dict | None, args: argparse.Namespace) -> str:
    """The exit line of a run the signal stopped (_finished says the others)."""
    from autoplan.runtime.checkpoint_names import step_dir
    from autoplan.runtime.metrics import last_recorded_step

    name = signal.Signals(outcome.signal).name
    if outcome.killed or summary is None:
        how = "killed torchrun and the ranks" if outcome.killed else "the ranks stopped"
        last = last_recorded_step(args.metrics_file)
        ran = (f"; the last step recorded in --metrics-file was {last}" if last is not None
               else "" if args.metrics_file is None else "; --metrics-file recorded no step")
        return f"stopped by {name}: {how} without a summary{ran}; {_saved(args)}"
    step = summary.get("final_step")
    if step is None:
        return f"stopped by {name} before the first step finished (nothing saved)"
    if args.checkpoint_dir:
        return (f"stopped by {name} after step {step}; checkpoint {step_dir(step)} saved in "
                f"{args.checkpoint_dir}; continue with --resume")
    return f"stopped by {name} after step {step} (no --checkpoint-dir: nothing saved)"


def _saved(args: argparse.Namespace) -> str:
    """What a --resume after a stop without a summary would continue from."""
    from autoplan.runtime.checkpoint_files import newest_intact

    if not args.checkpoint_dir:
        return "no --checkpoint-dir: nothing saved"
    found, _ = newest_intact(args.checkpoint_dir)
    if found is None:
        return f"no whole checkpoint in {args.checkpoint_dir}: nothing to resume"
    steps = getattr(args, "steps", None)
    if steps is not None and found.step >= steps:
        return (f"{found.path.name} in {args.checkpoint_dir} holds the last step of --steps "
                f"{steps}: nothing is left to resume")
    return f"--resume continues from {found.path.name} (step {found.step})"
