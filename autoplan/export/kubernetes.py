"""`--to kubernetes`: the job as a Kubeflow Trainer v2 TrainJob (default), a legacy Kubeflow
PyTorchJob, or a plain JobSet; each node runs torchrun, which runs `autoplan train PLAN`.

The plan travels inside the manifest (an environment variable written to a file at start), with
its model spec inlined, so the image needs autoplan but no copy of the plan. A hardware profile
the image cannot find by name (a path, or a profile of this machine's user directory, such as
`autoplan profile` writes) travels the same way, and the plan points at that copy. `--elastic`: a
PyTorchJob with an elasticPolicy, or a JobSet whose torchrun takes `--nnodes=MIN:MAX`; either
way `autoplan train --elastic` re-plans for the pods left, on nodes of the size written. A CPU
profile's plan requests a CPU per rank and no GPU, and trains on gloo. What each pod gets
besides (/dev/shm, the --pvc and --data-pvc claims, memory requests, a grace period as long as
the SLURM job's time-limit warning) is kube_pods.py's; where it goes in each kind is this file's.
How a PyTorchJob's or TrainJob's pod ends (restarted after a clean stop short of --steps) is
kube_ending.py's; the names the cluster must accept, kube_names.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autoplan import resources
from autoplan.export.base import ExportOptions, ExportTarget, Layout, layout, layout_reasons
from autoplan.export.job_inputs import shown
from autoplan.export.kube_ending import (
    LAUNCH,
    RESTART_KINDS,
    Script,
    ending_lines,
    launch_function,
    saved_step_env,
)
from autoplan.export.kube_names import check_dns_label, check_k8s_job_name
from autoplan.export.kube_pods import (
    FAILED_BY_POLICY,
    PLAN_FILE,
    PROFILE_FILE,
    check_volumes,
    disruption_lines,
    grace_lines,
    memory_request,
    node_resources,
    pod_failure_policy,
    pod_storage,
    resource_lines,
    storage_lines,
)
from autoplan.export.launch import (
    ELASTIC_ENV,
    SHUTDOWN_ENV,
    check_min_nodes,
    check_path_word,
    check_train_data,
    check_train_run,
    comment,
    max_restarts,
    on_cpu,
    runtime_reasons,
    shell_join,
    stop_lead,
    torchrun_argv,
    train_argv,
)
from autoplan.export.nodes import NODE_SIZE_ENV
from autoplan.model_spec import ModelSpec
from autoplan.plan import ClusterRef, Plan
from autoplan.plan_files import plan_to_dict
from autoplan.yaml_io import dump_yaml, read_yaml

KINDS = ("trainjob", "pytorchjob", "jobset")
PLAN_ENV = "AUTOPLAN_PLAN_YAML"
PROFILE_ENV = "AUTOPLAN_PROFILE_YAML"
FILES = {PLAN_ENV: PLAN_FILE, PROFILE_ENV: PROFILE_FILE}
"""Environment variable -> the file the pod's script writes it to before torchrun starts."""
TRAINER_RUNTIME = "torch-distributed"
"""The ClusterTrainingRuntime Kubeflow Trainer installs for PyTorch (torchrun) jobs."""
TRAINER_NODE = "node"
"""The replicated job and the container of the torch-distributed ClusterTrainingRuntime
(kubeflow/trainer manifests/base/runtimes/torch_distributed.yaml)."""
PATCH_MANAGER = "autoplan"
"""The TrainJob's spec.runtimePatches entry autoplan owns (its `manager` key)."""
DISRUPTION_RULE = "restartOnEviction"
"""The name of the JobSet failure policy rule for evicted and preempted pods (required, and
matching ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$: kubernetes-sigs/jobset jobset_types.go)."""


def _script(torchrun: list[str], opts: ExportOptions, payload: dict[str, str],
            lay: Layout | None = None, *, cpu: bool = False, pods: int = 0) -> str:
    """sh -c text: write the plan (and a shipped profile) from the environment, then run torchrun
    on the plan: `exec` it (a JobSet), or, on `pods` pods that restart (a PyTorchJob's, a
    TrainJob's), through kube_ending.launch_function."""
    writes = [f'printf "%s\\n" "${env}" > {FILES[env]}' for env in payload]
    # only torchrun's own words may hold $(...) expansions; the user's values are single-quoted
    run = (shell_join([LAUNCH if pods else "exec", *torchrun], keep=("$(",)) + " "
           + shell_join(train_argv(opts, PLAN_FILE, lay, cpu=cpu)))
    chain = " && ".join([*writes, run])
    return Script("\n".join([*launch_function(opts, pods), chain])) if pods else chain


def _env(payload: dict[str, str], opts: ExportOptions, grace_s: int,
         restarts: bool = False) -> list[dict[str, str]]:
    """The payload, torchrun's shutdown timeout (as long as the pod's grace period), the file
    rank 0 names the step saved in where the pods restart, and an elastic job's settings."""
    env = [{"name": name, "value": text} for name, text in payload.items()]
    env.append({"name": SHUTDOWN_ENV, "value": str(grace_s)})
    if restarts:
        env.append(saved_step_env(opts))
    if opts.elastic:  # and the node size `autoplan train --elastic` re-plans on
        env += [{"name": ELASTIC_ENV[0], "value": ELASTIC_ENV[1]},
                {"name": NODE_SIZE_ENV, "value": str(opts.gpus_per_node)}]
    return env


def _container(name: str, script: str, payload: dict[str, str], opts: ExportOptions,
               resources: dict[str, dict[str, str]], grace_s: int) -> dict:
    return {
        "name": name,
        "image": opts.image,
        "command": ["/bin/sh", "-c", script],
        "env": _env(payload, opts, grace_s, isinstance(script, Script)),
        "resources": resources,
        "volumeMounts": pod_storage(opts)[1],
    }


def _pod_spec(container: dict[str, Any], opts: ExportOptions, grace_s: int,
              **fields: Any) -> dict[str, Any]:
    """A pod template's spec: `fields` (restartPolicy), the grace period, the container, the
    volumes."""
    return {**fields, "terminationGracePeriodSeconds": grace_s, "containers": [container],
            "volumes": pod_storage(opts)[0]}


def shipped_profile(plan: Plan) -> str | None:
    """The plan's profile as YAML where a pod cannot find it by name: a path, or a name this
    machine resolves in the user's profile directory; None for a profile autoplan ships."""
    ref = plan.cluster.profile
    path = Path(ref)
    if resources.is_name(ref):
        found = resources.find(resources.PROFILES, str(ref))
        if found is None or found.parent == resources.package_dir(resources.PROFILES):
            return None
        path = found
    return dump_yaml(read_yaml(path, "cluster.profile"))


def _metadata(opts: ExportOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": opts.job_name, "labels": {"app.kubernetes.io/name": "autoplan"}}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return meta


def train_job(lay: Layout, payload: dict[str, str], opts: ExportOptions, cpu: bool,
              resources: dict[str, dict[str, str]], grace_s: int) -> dict[str, Any]:
    """TrainJob (trainer.kubeflow.org/v1alpha1); the torch runtime sets torchrun's PET_* env.
    The volumes and the grace period go through spec.runtimePatches (Kubeflow Trainer >= v2.2,
    which replaced podTemplateOverrides with it; the grace period >= v2.3) into the runtime's
    `node` pods and container."""
    script = _script(["torchrun", f"--max-restarts={max_restarts(opts)}", "--no-python"], opts,
                     payload, cpu=cpu, pods=lay.num_nodes)
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _metadata(opts),
        "spec": {
            "runtimeRef": {"name": TRAINER_RUNTIME},
            "trainer": {
                "image": opts.image,
                "command": ["/bin/sh", "-c", script],
                "env": _env(payload, opts, grace_s, True),  # elastic: refused (check)
                "numNodes": lay.num_nodes,
                "numProcPerNode": lay.nproc_per_node,
                "resourcesPerNode": resources,
            },
            "runtimePatches": [runtime_patch(opts, grace_s)],
        },
    }


def runtime_patch(opts: ExportOptions, grace_s: int) -> dict[str, Any]:
    """TrainJob spec.runtimePatches entry (kubeflow/trainer pkg/apis/trainer/v1alpha1
    trainjob_types.go, RuntimePatch down to PodSpecPatch and ContainerPatch): the grace period
    (PodSpecPatch.terminationGracePeriodSeconds, kubeflow/trainer#3324, Trainer v2.3) and
    pod_storage's volumes in the `node` job's pods, its mounts in their `node` container."""
    volumes, mounts = pod_storage(opts)
    pod = {"terminationGracePeriodSeconds": grace_s, "volumes": volumes,
           "containers": [{"name": TRAINER_NODE, "volumeMounts": mounts}]}
    job = {"name": TRAINER_NODE, "template": {"spec": {"template": {"spec": pod}}}}
    return {"manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def pytorch_job(lay: Layout, payload: dict[str, str], opts: ExportOptions, cpu: bool,
                resources: dict[str, dict[str, str]], grace_s: int) -> dict[str, Any]:
    """PyTorchJob (kubeflow.org/v1): the operator sets PET_NNODES, PET_NODE_RANK, PET_MASTER_*."""
    script = _script(["torchrun", f"--max-restarts={max_restarts(opts)}", "--no-python"], opts,
                     payload, lay, cpu=cpu, pods=lay.num_nodes)

    def replica(n: int) -> dict[str, Any]:
        container = _container("pytorch", script, payload, opts, resources, grace_s)
        template = {"spec": _pod_spec(container, opts, grace_s)}
        return {"replicas": n, "restartPolicy": "OnFailure", "template": template}

    if opts.elastic:  # workers only, as the operator's elastic examples run them
        specs = {"Worker": replica(lay.num_nodes)}
    else:
        specs = {"Master": replica(1)}
        if lay.num_nodes > 1:
            specs["Worker"] = replica(lay.num_nodes - 1)
    spec: dict[str, Any] = {}
    if opts.elastic:
        spec["elasticPolicy"] = elastic_policy(lay, opts)
    spec |= {
        "nprocPerNode": str(lay.nproc_per_node),
        "pytorchReplicaSpecs": specs,
        "runPolicy": {"cleanPodPolicy": "None"},  # required by the v1 API
    }
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(opts),
            "spec": spec}


def elastic_policy(lay: Layout, opts: ExportOptions) -> dict[str, Any]:
    """PyTorchJob spec.elasticPolicy as kubeflow/training-operator defines it
    (pkg/apis/kubeflow.org/v1/pytorch_types.go, type ElasticPolicy: minReplicas, maxReplicas,
    rdzvBackend c10d|etcd|etcd-v2, maxRestarts); the operator then gives torchrun
    PET_NNODES=min:max and a c10d rendezvous on the first worker."""
    return {"minReplicas": opts.min_nodes, "maxReplicas": lay.num_nodes, "rdzvBackend": "c10d",
            "maxRestarts": max_restarts(opts)}


def job_set(lay: Layout, payload: dict[str, str], opts: ExportOptions, cpu: bool,
            resources: dict[str, dict[str, str]], grace_s: int) -> dict[str, Any]:
    """JobSet (jobset.x-k8s.io/v1alpha2): one Indexed Job of num_nodes pods, c10d on pod 0; a
    pod evicted or preempted fails the Job through its pod failure policy, which restarts the
    JobSet without spending maxRestarts (jobset_failure_policy)."""
    head = f"{opts.job_name}-node-0-0.{opts.job_name}"  # <jobset>-<rjob>-<job>-<pod>.<subdomain>
    torchrun = torchrun_argv(lay, opts, rdzv_host=head, rdzv_id=opts.job_name)
    if "--standalone" in torchrun:  # one pod: keep the same c10d form as several
        torchrun = torchrun_argv(
            Layout(1, lay.nproc_per_node), opts, rdzv_host=head, rdzv_id=opts.job_name
        )
    container = _container("trainer", _script(torchrun, opts, payload, lay, cpu=cpu), payload, opts,
                           resources, grace_s)
    job_spec = {
        "parallelism": lay.num_nodes,
        "completions": lay.num_nodes,
        "completionMode": "Indexed",
        # elastic: a failed pod is recreated and rejoins (the others re-plan meanwhile)
        "backoffLimit": max_restarts(opts) if opts.elastic else 0,
        # elastic too: the evicted pod's ranks stop and save with every other rank (the stop
        # is agreed in the step), so the others end cleanly and only a restart of the whole
        # JobSet brings the job back; a replacement pod alone would wait for the nodes gone
        "podFailurePolicy": pod_failure_policy(),
        "template": {"spec": _pod_spec(container, opts, grace_s, restartPolicy="Never")},
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _metadata(opts),
        "spec": {
            "network": {"enableDNSHostnames": True},
            "failurePolicy": jobset_failure_policy(max_restarts(opts)),
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": job_spec}}],
        },
    }


def jobset_failure_policy(restarts: int) -> dict[str, Any]:
    """JobSet spec.failurePolicy (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go
    at 0336a8fd9fd3ba7a8e5d3e16462138b746e01ec8: FailurePolicy of maxRestarts and rules;
    FailurePolicyRule of name, action, onJobFailureReasons; rules since JobSet v0.6.0): a Job
    failed by its pod failure policy (reason PodFailurePolicy: pod_failure_policy fails a Job
    only for a disrupted pod) restarts the JobSet with RestartJobSetAndIgnoreMaxRestarts, which
    leaves restartsCountTowardsMax alone; any other failure matches no rule and takes the
    default, RestartJobSet, counted against `restarts`. The pattern of JobSet's own docs
    (site/content/en/docs/tasks/failure_policy.md, "Handling Host Maintenance Events"). A
    FailJob rule on exit codes added to the pod failure policy would restart without limit
    too."""
    return {"maxRestarts": restarts,
            "rules": [{"name": DISRUPTION_RULE, "action": "RestartJobSetAndIgnoreMaxRestarts",
                       "onJobFailureReasons": [FAILED_BY_POLICY]}]}


def _payload_lines(profile: str, shipped: bool) -> list[str]:
    """The header's word on where the plan (and a profile that travels with it) lies in the
    pod: check_volumes keeps every claim off those files."""
    if shipped:
        return comment(f"The plan and profile {shown(profile)} travel in the manifest "
                       f"({PLAN_ENV}, {PROFILE_ENV}): the pod's script writes them to "
                       f"{PLAN_FILE} and {PROFILE_FILE}, the plan naming that copy, before "
                       "torchrun starts.")
    return comment(f"The plan travels in the manifest ({PLAN_ENV}): the pod's script writes it "
                   f"to {PLAN_FILE} before torchrun starts; the image finds profile "
                   f"{shown(profile)} by name.")


class _NoAliases(yaml.SafeDumper):
    """safe_dump that writes a value each place it appears (the replicas share volumes and
    resources): no &anchors and *aliases, which some manifest tools do not follow."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_NoAliases.add_representer(Script, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|"))


BUILDERS = {"trainjob": train_job, "pytorchjob": pytorch_job, "jobset": job_set}


class KubernetesTarget(ExportTarget):
    name = "kubernetes"
    summary = "Kubernetes manifest: Kubeflow TrainJob (default), PyTorchJob or JobSet (--kind)"

    def check(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> list[str]:
        if opts.namespace is not None:
            check_dns_label("--namespace", opts.namespace)
        check_path_word("--checkpoint-dir", opts.checkpoint_dir)
        check_path_word("--image", opts.image)
        check_train_run(opts)
        check_train_data(opts, model, in_pod=True)
        check_volumes(opts)
        why = layout_reasons(plan, opts.gpus_per_node)
        lay = None if why else layout(plan, opts.gpus_per_node)
        check_min_nodes(opts, lay)
        if opts.k8s_kind not in KINDS:
            why.append(f"--kind {opts.k8s_kind!r}: choose one of {', '.join(KINDS)}")
        else:  # pod names grow with the node count (one pod per node)
            check_k8s_job_name(opts.job_name, opts.k8s_kind, lay or Layout(1, 1), opts.elastic)
        if opts.elastic and opts.k8s_kind == "trainjob":
            # kubeflow/training-operator sdk/docs/TrainerV1alpha1TorchElasticPolicy.md: the
            # bounds (min_nodes, max_nodes, max_restarts) are the runtime's torch policy
            why.append("--elastic with --kind trainjob: Kubeflow Trainer sets elastic bounds in "
                       "the ClusterTrainingRuntime (mlPolicy.torch.elasticPolicy), not in a "
                       "TrainJob; use --kind pytorchjob or --kind jobset")
        return why + runtime_reasons(plan, model)

    def render(self, plan: Plan, model: ModelSpec, opts: ExportOptions) -> dict[str, str]:
        lay = layout(plan, opts.gpus_per_node)
        cpu = on_cpu(plan)
        # sized from the profile as priced, before the plan is pointed at the pod's copy of it
        memory = memory_request(plan, lay)
        lead = stop_lead(plan, model, opts.gpus_per_node)  # as the SLURM time-limit warning
        resources = node_resources(lay.nproc_per_node, cpu, memory)
        restarts = opts.k8s_kind in RESTART_KINDS  # the shell passes SIGTERM on (kube_ending)
        lines = [*storage_lines(opts, lay.num_nodes),
                 *resource_lines(lay, cpu, memory, plan.cluster.profile),
                 *grace_lines(lead, restarts), *disruption_lines(opts.k8s_kind, max_restarts(opts)),
                 *(ending_lines(opts, lay.num_nodes) if restarts else [])]
        profile = shipped_profile(plan)
        lines += _payload_lines(plan.cluster.profile, profile is not None)
        if profile is not None:
            plan = plan.replace(cluster=ClusterRef(PROFILE_FILE, plan.cluster.num_gpus))
        payload = {PLAN_ENV: dump_yaml(plan_to_dict(plan.replace(model=model)))}
        if profile is not None:
            payload[PROFILE_ENV] = profile
        manifest = BUILDERS[opts.k8s_kind](lay, payload, opts, cpu, resources, lead.seconds_s)
        lines.insert(0, f"# {manifest['kind']} written by `autoplan export --to kubernetes`: "
                        f"{lay.num_nodes} node(s) x {lay.nproc_per_node} "
                        f"{'CPU' if cpu else 'GPU'}(s).")
        if opts.k8s_kind == "trainjob":
            lines += comment("The volumes and the grace period reach the runtime's node pods "
                             "through spec.runtimePatches: Kubeflow Trainer v2.3 or later, whose "
                             "patches take terminationGracePeriodSeconds (kubeflow/trainer#3324); "
                             "on v2.2 delete the terminationGracePeriodSeconds line under "
                             "spec.runtimePatches and set it in the ClusterTrainingRuntime's "
                             "node pods (v2.0 and v2.1 took spec.podTemplateOverrides instead).")
        header = "".join(line + "\n" for line in lines)
        body = yaml.dump(manifest, Dumper=_NoAliases, sort_keys=False, default_flow_style=False,
                         width=100)
        return {f"{opts.job_name}-{opts.k8s_kind}.yaml": header + body}
