"""How a PyTorchJob's or TrainJob's pod ends: its shell, process 1, passes SIGTERM on to torchrun
and exits non-zero after a clean stop short of --steps, so restartPolicy OnFailure restarts it to
resume (saved_step.end_lines decides). A JobSet's pods keep torchrun's status (kubernetes.py)."""

from __future__ import annotations

import posixpath

from autoplan.export import saved_step
from autoplan.export.base import ExportOptions
from autoplan.export.launch import comment, launch_options, plural, shell_join
from autoplan.export.torchrun import SAVED_STEP_FILE
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV

RESTART_KINDS = ("trainjob", "pytorchjob")
"""The kinds whose pods restart in place (restartPolicy OnFailure): a PyTorchJob's replicas as
written; a TrainJob's because the torch-distributed runtime's pod template sets no restartPolicy
and JobSet's webhook defaults it to OnFailure (kubernetes-sigs/jobset pkg/webhooks/
jobset_webhook.go Default, at ec942521899668e414d1775da8a2acffbd1b1d17; kubeflow/trainer
manifests/base/runtimes/torch_distributed.yaml at 0c78efb0ccfce7b35fc2867b832f5cfed7750460).
A JobSet's pods are restartPolicy Never: there a non-zero exit would fail the Job for a reason
the eviction rule does not match, spending maxRestarts (kube_pods.pod_failure_policy)."""
RESTART_STATUS = 75
"""A clean stop's exit status short of --steps: EX_TEMPFAIL of BSD's sysexits.h ("temporary
failure ... the user is invited to retry"), apart from torchrun's 1 after a crash."""
LAUNCH = "run"
"""The shell function the pod's script runs torchrun through (launch_function)."""
CAUSE = "a pod of this job was evicted, preempted, drained or deleted"


class Script(str):
    """A pod's script of several lines, which the manifest writes as a YAML literal block."""


def saved_step_file(opts: ExportOptions) -> str:
    """SAVED_STEP_ENV's file: in the checkpoint folder (which --pvc shares), named after the
    job, so every pod of the job, and every restart of it, names the same file."""
    return posixpath.join(opts.checkpoint_dir, SAVED_STEP_FILE + opts.job_name)


def saved_step_env(opts: ExportOptions) -> dict[str, str]:
    """The pods' SAVED_STEP_ENV, which rank 0 writes the step to and the script reads."""
    return {"name": SAVED_STEP_ENV, "value": saved_step_file(opts)}


def launch_function(opts: ExportOptions, num_pods: int) -> list[str]:
    """`run() { ... }`, run as `run torchrun ARGS`: torchrun in the background, SIGTERM passed on
    to it (process 1 ignores a signal it has no trap for, so `exec` alone would end the ranks
    only by SIGKILL at the grace period), a wait that a trapped SIGTERM cuts short waited again;
    then saved_step.end_lines, whose stop short of --steps exits RESTART_STATUS. On several
    pods the file stays for the others to read: pods restart at different times, and one that
    removed it at its start could hide a stop from another still to read it, which would then
    end 0 short of --steps, so each reads it before torchrun starts and takes a line still
    unchanged at the end for an earlier attempt's (saved_step.STALE_RULE): a crash after an
    earlier clean stop keeps torchrun's status. One pod removes an earlier job's file first."""
    run = launch_options(opts)
    folder = shell_join([opts.checkpoint_dir])
    then = shell_join([f"exiting {RESTART_STATUS}; restartPolicy OnFailure restarts this "
                       "container, which resumes from it"])
    on_stop = ["  " + saved_step.stopped_line(run.steps, folder, CAUSE, then),
               f"  exit {RESTART_STATUS}"]
    start = saved_step.start_lines() if num_pods > 1 else [
        f"rm -f -- {saved_step.FILE}  # an earlier job's: rank 0 writes this run's at its end"]
    body = [
        *start,
        "pid=",
        "stopping=",
        "trap 'stopping=1; kill -TERM \"$pid\" 2>/dev/null' TERM  # process 1: pass it on",
        '"$@" &',
        "pid=$!",
        "status=0",
        'wait "$pid" || status=$?',
        'while [ -n "$stopping" ]; do  # the trap cut wait short: wait for torchrun\'s end',
        "  stopping=",
        "  status=0",
        '  wait "$pid" || status=$?',
        "done",
        *saved_step.end_lines(run.steps, folder, launcher="torchrun", on_stop=on_stop,
                              keep_file=num_pods > 1, unchanged_is_stale=num_pods > 1),
    ]
    return [f"{LAUNCH}() {{", *("  " + line if line else "" for line in body), "}"]


def ending_lines(opts: ExportOptions, num_pods: int) -> list[str]:
    """The header's word on how a pod of a PyTorchJob or TrainJob ends (launch_function). The
    300 s: torch.distributed.elastic's SimpleElasticAgent exit_barrier_timeout, which a torchrun
    whose ranks succeeded waits for every other node's torchrun (an evicted one's raised
    SignalException and never comes), unless the store's host ends first."""
    run = launch_options(opts)
    steps = run.steps
    ended = ("a Master so ended marks the PyTorchJob Succeeded short of its steps"
             if opts.k8s_kind == "pytorchjob" else "each completes its index of the node Job")
    text = (
        "Ending: a pod evicted, preempted, drained or deleted gets SIGTERM, and every rank "
        "stops after the step in progress and saves a checkpoint (the ranks agree the stop), so "
        "torchrun exits 0 on the other pods (after waiting up to 300 s at its exit barrier for "
        "the lost pod's torchrun), which would end Succeeded and never rejoin the pod recreated "
        f"for the one lost ({ended}). So each pod's shell, the container's process 1, passes "
        f"SIGTERM on to torchrun and then reads the step rank 0 writes to ${SAVED_STEP_ENV} "
        f"({saved_step_file(opts)}) once every rank has saved: short of {steps} "
        f"{plural(steps, 'step')} it prints a line saying so and exits {RESTART_STATUS}, and "
        "restartPolicy OnFailure restarts the container in place, which resumes from that "
        "checkpoint; with every step trained it exits 0, even where torchrun exited 1 after "
        "passing a SIGTERM on; without the file (a crash, or ranks killed before their save), "
        "torchrun's status.")
    if num_pods > 1:
        text += (" The file stays between restarts (pods restart at different times, and one "
                 "removing it could hide a stop from another yet to read it), so each pod reads "
                 f"it before torchrun starts: {saved_step.STALE_RULE}. A crash after an earlier "
                 "clean stop so keeps torchrun's status; a pod recreated before the last "
                 f"attempt's rank 0 wrote its line may still read that line and exit "
                 f"{RESTART_STATUS} after a crash (restarted either way), never 0.")
        if run.pvc is None:
            text += (f" No claim is shared by the {num_pods} pods (--pvc): only the pod of rank "
                     "0 sees the file, and the others end 0 after a clean stop, as torchrun "
                     "does: export --checkpoint-dir /checkpoints --pvc CLAIM.")
    if opts.k8s_kind == "trainjob":
        text += (" A TrainJob's pods restart in place because the torch-distributed runtime's "
                 "pod template sets no restartPolicy, which JobSet defaults to OnFailure; each "
                 "restart, and each pod lost, counts against the node Job's backoffLimit "
                 "(Kubernetes' default 6: the runtime sets none), about one per pod for each "
                 "stop: for more, set backoffLimit in the ClusterTrainingRuntime's node Job. A "
                 "runtime given --kind jobset's rules (restartPolicy Never) would count exit "
                 f"{RESTART_STATUS} as a failure: export --kind jobset for those.")
    else:
        text += " A PyTorchJob restarts without limit: it sets no runPolicy.backoffLimit."
    return comment(text)
