"""What every pod of a Kubernetes export gets besides its command: a memory-backed /dev/shm,
the claims --pvc and --data-pvc name mounted at the checkpoint folder and the folder of --data
(never over the files the pod's script writes the plan to), GPU limits and CPU/memory requests
from the profile, a termination grace period of the stop lead, a pod failure policy that tells
an eviction from a crash; and the manifest header's word on each. Where they go in a TrainJob,
PyTorchJob or JobSet is kubernetes.py's.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, Layout
from autoplan.export.job_inputs import shown
from autoplan.export.launch import SHUTDOWN_ENV, StopLead, comment, data_lines, launch_options
from autoplan.export.nodes import profile_on_nodes
from autoplan.plan import Plan

GPU_RESOURCE = "nvidia.com/gpu"
PLAN_FILE = "/tmp/autoplan-plan.yaml"
PROFILE_FILE = "/tmp/autoplan-profile.yaml"
"""Where the pod's script writes the plan (and a profile that travels with it) from the
manifest's environment before torchrun starts: no claim may be mounted over them
(check_volumes), read-only or hiding them."""
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
SUBDOMAIN_MAX = 253
"""A PersistentVolumeClaim's name is a DNS subdomain (Kubernetes, "Object Names and IDs",
kubernetes.io/docs/concepts/overview/working-with-objects/names)."""
SHM = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
"""/dev/shm for every pod: a container's is 64 MiB, which NCCL (its shared-memory transport
between a node's GPUs) and PyTorch's shared-memory tensors outgrow; memory-backed, it counts
against the pod's memory."""
MEMORY_SHARE = 0.75
"""Share of the profile's host memory (for the pod's GPUs) a pod requests: the pod is what the
node runs, and the kubelet evicts a pod past its request first under memory pressure; the rest
is left to the system and the kubelet (a node's allocatable is less than its memory)."""
GiB = 2**30


def check_dns_subdomain(flag: str, value: str) -> None:
    """Refuse a name that is not a DNS-1123 subdomain (a PersistentVolumeClaim's)."""
    if not DNS1123_SUBDOMAIN.fullmatch(value) or len(value) > SUBDOMAIN_MAX:
        raise ConfigError(flag, f"got {value[:80]!r} ({len(value)} characters)",
                          f"give the claim's name: at most {SUBDOMAIN_MAX} lowercase letters, "
                          "digits, '-' and '.', starting and ending with a letter or digit "
                          "(kubectl get pvc lists them)")


def check_volumes(opts: ExportOptions) -> None:
    """Refuse a --pvc or --data-pvc that names no claim or has nowhere to be mounted: a
    volume mounts at an absolute folder, not at /, not over /dev/shm or the plan's file, one
    per folder; a TrainJob mounts one claim at one folder only."""
    run = launch_options(opts)
    if run.pvc is not None:
        check_dns_subdomain("--pvc", run.pvc)
        _check_mount("--checkpoint-dir", opts.checkpoint_dir,
                     posixpath.normpath(opts.checkpoint_dir), "--pvc mounts the claim at it")
    if run.data_pvc is None:
        return
    check_dns_subdomain("--data-pvc", run.data_pvc)
    if run.data is None:
        raise ConfigError("--data-pvc", f"got {run.data_pvc} without --data", "add --data PATH "
                          "(the text's path in the pod), or drop --data-pvc")
    folder = data_folder(run.data)
    _check_mount("--data", run.data, folder, "--data-pvc mounts the claim at its folder")
    checkpoints = posixpath.normpath(opts.checkpoint_dir)
    if run.pvc not in (None, run.data_pvc) and folder == checkpoints:
        raise ConfigError("--data-pvc", f"{run.data_pvc} would be mounted at {folder}, where "
                          f"--pvc mounts {run.pvc}", "keep the text in another folder than the "
                          "checkpoints, or give one claim to both")
    if opts.k8s_kind == "trainjob" and run.pvc == run.data_pvc and folder != checkpoints:
        raise ConfigError(
            "--data-pvc", f"{run.data_pvc} is --pvc's claim too, mounted at {checkpoints}: "
            f"--kind trainjob cannot mount it at {folder} as well (a TrainJob's runtimePatches "
            "take one mount per volume, and two volumes of one claim can leave the pods waiting "
            "on their mounts, kubernetes/kubernetes#127004)",
            f"give the text its own claim, put it in {checkpoints}, or export --kind jobset or "
            "--kind pytorchjob, which mount one claim at both")


def _check_mount(flag: str, path: str, folder: str, why: str) -> None:
    """Refuse mounting at `folder` (for `path`, given as `flag`): only an absolute folder, not
    /, not inside the pod's shared memory, not over the files the pod's script writes (a claim
    at /tmp would hide them, or, read-only, stop the script writing them)."""
    example = "/checkpoints" if flag == "--checkpoint-dir" else "/data/corpus.txt"
    if not path.startswith("/"):
        raise ConfigError(flag, f"{shown(path)} is relative and {why}",
                          f"give the absolute path in the pod, e.g. {example}")
    if folder == "/" or folder == "/dev/shm" or folder.startswith("/dev/shm/"):
        raise ConfigError(flag, f"{shown(path)}: {why}, {folder}, where no volume can go (the "
                          "root, or the pod's shared memory)", f"give another folder, e.g. "
                          f"{example}")
    inside = "/" + folder.lstrip("/")  # POSIX lets a path start with //, the same folder
    for written in (PLAN_FILE, PROFILE_FILE):
        if written == inside or written.startswith(inside + "/") \
                or inside.startswith(written + "/"):
            raise ConfigError(flag, f"{shown(path)}: {why}, {folder}, over {written}, where the "
                              "pod's script writes the plan before torchrun starts",
                              f"give a folder outside {posixpath.dirname(written)}, e.g. "
                              f"{example}")


def data_folder(data: str) -> str:
    """The folder --data's claim is mounted at: the folder holding the text (a file, or a
    folder of text files), which lies at the claim's root."""
    return posixpath.dirname(posixpath.normpath(data))


def pod_storage(opts: ExportOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every pod's volumes and the trainer container's mounts: /dev/shm (SHM); --pvc's claim
    at the checkpoint folder; --data-pvc's, read-only, at the folder of --data (one volume
    when both name one claim, mounted at both folders, which a TrainJob cannot write and
    check_volumes refuses; one mount where both folders are one)."""
    run = launch_options(opts)
    volumes = [SHM]
    mounts: list[dict[str, Any]] = [{"name": SHM["name"], "mountPath": "/dev/shm"}]
    claims: dict[str, str] = {}  # claim -> volume name
    for claim, name, path, read_only in (
            (run.pvc, "checkpoints", opts.checkpoint_dir, False),
            (run.data_pvc, "data", None if run.data is None else data_folder(run.data), True)):
        if claim is None or path is None:
            continue
        if claim not in claims:
            claims[claim] = name
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim}})
        path = posixpath.normpath(path)
        if any(m["mountPath"] == path for m in mounts):
            continue  # the text in the checkpoint folder: that claim is mounted there already
        mount = {"name": claims[claim], "mountPath": path}
        mounts.append(mount | ({"readOnly": True} if read_only else {}))
    return volumes, mounts


@dataclass(frozen=True)
class MemoryRequest:
    """A pod's memory request and what it is sized from."""

    request_bytes: int
    """What the pod requests: whole GiB."""
    host_bytes: int
    """The profile's host memory, of one node of `node_ranks` GPUs (CPU rank slots)."""
    node_ranks: int
    """The profile's gpus_per_node: the node its host memory is of, whatever node size the
    job is written for (--gpus-per-node)."""
    pod_ranks: int


def memory_request(plan: Plan, lay: Layout) -> MemoryRequest | None:
    """A pod's memory request: MEMORY_SHARE of the profile's host memory per node, in the share
    of that node the pod's ranks are (pod ranks / the profile's gpus_per_node, at most a whole
    node: the price, too, gives a larger node no more host memory), whole GiB; None where the
    profile does not load here (another site's). `plan` names the profile as priced, not the
    pod's copy of it."""
    try:
        profile = profile_on_nodes(plan.cluster.profile, None)
    except ConfigError:
        return None
    node, pod = profile.gpus_per_node, lay.nproc_per_node
    host = profile.host.memory_bytes
    return MemoryRequest(int(host * min(1.0, pod / node) * MEMORY_SHARE) // GiB * GiB, host,
                         node, pod)


def node_resources(nproc: int, cpu: bool, memory: MemoryRequest | None = None
                   ) -> dict[str, dict[str, str]]:
    """A pod's (a node's) resources: its GPUs as limits (an extended resource is requested by
    its limit); a CPU plan: one CPU per rank as requests, and no GPU; `memory` as a memory
    request (no limit: a pod past a limit is killed, past a request only evicted first)."""
    requests = {"cpu": str(nproc)} if cpu else {}
    if memory is not None and memory.request_bytes:
        requests["memory"] = f"{memory.request_bytes // GiB}Gi"
    out = {"requests": requests} if requests else {}
    return out if cpu else out | {"limits": {GPU_RESOURCE: str(nproc)}}


def resource_lines(lay: Layout, cpu: bool, memory: MemoryRequest | None,
                   profile: str) -> list[str]:
    """The header's word on what each pod requests and why; `profile` as priced."""
    unit = "rank slots" if cpu else "GPUs"
    evicts = ""
    if memory is None:
        text = (f"no memory request: profile {shown(profile)} does not load here, so its host "
                "memory is unknown (add resources.requests.memory for your nodes)")
    else:
        node = f"{memory.host_bytes / GiB:.0f} GiB of a node of {memory.node_ranks} {unit}"
        share = (f" for the pod's {memory.pod_ranks} {unit}" if memory.pod_ranks
                 <= memory.node_ranks else f", for the pod's {memory.pod_ranks} {unit} as for "
                 "one such node (the price has them share its memory)")
        text = (f"memory request {memory.request_bytes // GiB}Gi, {MEMORY_SHARE:.0%} of profile "
                f"{shown(profile)}'s host memory ({node}){share}")
        evicts = (" The kubelet evicts a pod past its memory request first: lower it if your "
                  "nodes allocate less.")
    cores = (f"{lay.nproc_per_node} CPUs, one per rank" if cpu else
             "no CPU request: the profile gives no core count (add resources.requests.cpu "
             "for your nodes)")
    return comment(f"Each pod: {text}; {cores}.{evicts} /dev/shm is a memory-backed emptyDir (a "
                   "container's own is 64 MiB, too small for NCCL and PyTorch's shared-memory "
                   "tensors); it counts against the pod's memory.")


def storage_lines(opts: ExportOptions, num_pods: int) -> list[str]:
    """The header's word on where checkpoints and --data lie in the pods, and what mounts
    them there (pod_storage) or must."""
    run = launch_options(opts)
    ckpt = shown(opts.checkpoint_dir)
    # torch.distributed.checkpoint: every rank writes its shard, every rank reads them back
    claim = (f"a ReadWriteMany claim, which all {num_pods} pods read and write" if num_pods > 1
             else "a claim the pod reads and writes")
    if run.pvc is not None:
        text = (f"checkpoints: {ckpt}, where PersistentVolumeClaim {run.pvc} is mounted in "
                f"every pod: every rank writes its shard there and reads them back on resume, "
                f"so it must be {claim}.")
    elif opts.checkpoint_dir.startswith("/"):
        text = (f"checkpoints: {ckpt} in every pod, where every rank writes its shard and "
                f"reads them back on resume: mount storage there, {claim} (export --pvc "
                "CLAIM), or they are lost with the pods.")
    else:
        text = (f"checkpoints: {ckpt}, relative to the image's working folder, where no storage "
                "is mounted: they are lost with the pods. To keep them: export --checkpoint-dir "
                f"/checkpoints --pvc CLAIM, {claim}.")
    lines = comment(text)
    if run.data is None:
        return lines + data_lines(opts, "")
    folder = data_folder(run.data)
    if run.data_pvc is not None:
        return lines + comment(
            f"data: {shown(run.data)} (byte-level text), read by every rank: "
            f"PersistentVolumeClaim {run.data_pvc} is mounted read-only at {shown(folder)}, "
            f"so the claim must hold {shown(posixpath.basename(posixpath.normpath(run.data)))} "
            "at its root.")
    return lines + comment(f"data: {shown(run.data)} (byte-level text), read by every rank "
                           f"inside its pod: mount a volume at {shown(folder)} (export "
                           "--data-pvc CLAIM) or build it into the image.")


def grace_lines(lead: StopLead, relay: bool = False) -> list[str]:
    """The header's word on every pod's terminationGracePeriodSeconds and torchrun's shutdown
    timeout, both the stop lead (launch.stop_lead, as the SLURM job's time-limit warning);
    `relay`: the pod's shell, not torchrun, is the container's process 1 (kube_ending)."""
    gets = ("which the pod's shell (the container's process 1) passes on to torchrun, and "
            "torchrun to the ranks" if relay else
            "which torchrun (the container's process 1) passes on to the ranks")
    return comment(
        f"Every pod gets terminationGracePeriodSeconds {lead.seconds_s} and {SHUTDOWN_ENV}="
        f"{lead.seconds_s}: a pod deleted, preempted or drained gets SIGTERM, {gets}, and they "
        "finish their step and save a checkpoint before SIGKILL ends the grace period "
        "(Kubernetes' default, 30 s, is shorter "
        f"than one step of a large plan). Sized as {lead.sized_as()}. Only a torchrun that has "
        f"--shutdown-timeout reads {SHUTDOWN_ENV} (pytorch/pytorch#172596): an older one kills "
        "its ranks 30 s after passing SIGTERM on, whatever the grace period. `kubectl delete "
        "--grace-period` and the kubelet's hard evictions (node memory pressure) allow less.")


DISRUPTED = "DisruptionTarget"
"""The pod condition the control plane adds to a pod it is about to take away: preempted by the
scheduler, evicted through the Eviction API (a node drain), by the taint manager or the
kubelet (node pressure, graceful node shutdown); Kubernetes 1.26 (beta, on by default), GA 1.31
(kubernetes.io/docs/concepts/workloads/pods/disruptions, "Pod disruption conditions")."""
FAILED_BY_POLICY = "PodFailurePolicy"
"""The reason of the Failed condition of a Job that a FailJob rule of its pod failure policy
failed (kubernetes/api batch/v1 types.go, JobReasonPodFailurePolicy): with pod_failure_policy
the only FailJob rule, a Job failed for this reason lost a pod to a disruption."""
SOURCES = {  # the commits read in full: kubernetes/api 8b76f66a8775732ec73ea921866ef2ce417bfd70,
    # kubernetes-sigs/jobset 0336a8fd9fd3ba7a8e5d3e16462138b746e01ec8,
    # kubeflow/trainer 0015772c282d9e127c9a08330485ef84b4fb3840,
    # kubeflow/training-operator 186ac6c6c878e57ec498f2ea6b585837f77a8d86
    "podFailurePolicy": "kubernetes/api batch/v1/types.go PodFailurePolicy (8b76f66a8775)",
    "failurePolicy.rules": "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go "
                           "FailurePolicyRule (0336a8fd9fd3)",
    "runtimePatches": "kubeflow/trainer pkg/apis/trainer/v1alpha1/trainjob_types.go "
                      "JobSpecPatch (0015772c282d)",
    "pytorchjob": "kubeflow/training-operator pkg/apis/kubeflow.org/v1/common_types.go "
                  "ReplicaSpec, RunPolicy (186ac6c6c878)",
}
"""Where each API this file writes, or says a kind lacks, is defined (repository, file, type,
the commit read), as the manifest's header cites it."""


def pod_failure_policy() -> dict[str, Any]:
    """A Job's spec.podFailurePolicy (kubernetes/api batch/v1 types.go: PodFailurePolicy, rules
    of action and onPodConditions of type and status): a pod that failed with DISRUPTED fails
    its Job at once (FailJob), with reason FAILED_BY_POLICY, which JobSet can restart without
    spending maxRestarts; any other failure counts against backoffLimit as before. Requires the
    pod template's restartPolicy Never. `status` is written although the API defaults it to
    True: the types mark it required (`json:"status"`, no omitempty, at the commit SOURCES
    names), and so do the schemas generated from them, such as a CRD that embeds a Job
    template, JobSet's among them, which then refuses a pattern without it.

    No rule on exit codes: the container's process is torchrun (`exec`), which exits 1 once it
    has passed a SIGTERM on to its ranks, whatever they did (torch.distributed.elastic raises
    SignalException), as it does after a crash; the ranks themselves return 0 after their
    save (143 and 130 are `autoplan train`'s own launcher's, which does not run in a pod). A
    rule on 143 would never match and one on 1 would take every crash for an eviction."""
    return {"rules": [{"action": "FailJob",
                       "onPodConditions": [{"type": DISRUPTED, "status": "True"}]}]}


def disruption_lines(kind: str, restarts: int) -> list[str]:
    """The header's word on what an evicted or preempted pod costs in each kind: a JobSet
    tells it from a crash (pod_failure_policy, kubernetes.jobset_failure_policy); a PyTorchJob's
    and a TrainJob's APIs cannot, and the line says so."""
    if kind == "jobset":
        return comment(
            f"A pod evicted or preempted (node drain, preemption, kubelet eviction: condition "
            f"{DISRUPTED}) fails its Job at once through spec.podFailurePolicy (FailJob; "
            "Kubernetes 1.26 or later, GA in 1.31; needs restartPolicy Never), and a Job failed "
            f"for reason {FAILED_BY_POLICY} restarts the JobSet with "
            "RestartJobSetAndIgnoreMaxRestarts (JobSet v0.6.0 or later), so evictions restart it "
            f"without limit and never spend failurePolicy.maxRestarts {restarts}, kept for crashes "
            "(an older cluster or JobSet refuses or drops these fields: evictions then count). "
            "So does a pod the kubelet evicts for its own memory use (node-pressure eviction "
            f"also sets {DISRUPTED}): a job that outgrows its node restarts without limit; "
            "`kubectl get jobset -o yaml` shows it, status.restarts growing while "
            "status.restartsCountTowardsMax does not. No "
            "rule reads exit codes: torchrun, the container's process, exits 1 once it has passed "
            "a SIGTERM on, as after a crash. APIs: "
            f"{SOURCES['podFailurePolicy']}; {SOURCES['failurePolicy.rules']}.")
    if kind == "trainjob":
        return comment(
            "Evictions and preemptions are handled as crashes: a TrainJob carries no pod failure "
            "policy or JobSet failure rules (its runtimePatches reach pod templates only: "
            f"{SOURCES['runtimePatches']}); the ClusterTrainingRuntime's JobSet template can "
            "hold them, as --kind jobset writes them.")
    return comment(
        "Evictions and preemptions are handled as crashes: a kubeflow.org/v1 PyTorchJob has no "
        f"pod failure policy ({SOURCES['pytorchjob']}); --kind jobset tells them apart.")
