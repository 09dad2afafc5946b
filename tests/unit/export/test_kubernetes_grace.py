"""Every Kubernetes pod gets as long to stop as the SLURM job's time-limit warning (one rule,
launch.stop_lead): terminationGracePeriodSeconds for the pod, TORCH_ELASTIC_SHUTDOWN_TIMEOUT
for torchrun, which passes the pod's SIGTERM on to the ranks; Kubernetes' default of 30 s
SIGKILLs ranks still in a long step or their save. Checked against the published API models
(test_kubernetes.validate)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from autoplan.export.base import export_plan
from autoplan.export.launch import SHUTDOWN_ENV, LaunchOptions, stop_lead
from autoplan.export.registry import get_target
from autoplan.plan import Batch, ClusterRef, Plan

from .cases import CASES
from .test_kubernetes import validate

KINDS = ("trainjob", "pytorchjob", "jobset")
SIGNAL = re.compile(r"^#SBATCH --signal=TERM@(\d+)$", re.M)


def _manifest(plan: Plan, kind: str) -> tuple[str, dict]:
    opts = LaunchOptions(gpus_per_node=8, k8s_kind=kind)
    [text] = export_plan(get_target("kubernetes"), plan, plan.model_spec(), opts).values()
    doc = yaml.safe_load(text)
    validate(kind, doc)  # the published API models read every field written
    return text, doc


def _grace_and_env(kind: str, doc: dict) -> list[tuple[Any, dict[str, str]]]:
    """(terminationGracePeriodSeconds, the trainer container's env) of every pod template."""
    if kind == "trainjob":
        [patch] = doc["spec"]["runtimePatches"]
        [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        pod = job["template"]["spec"]["template"]["spec"]
        env = doc["spec"]["trainer"]["env"]
        return [(pod.get("terminationGracePeriodSeconds"), {e["name"]: e["value"] for e in env})]
    if kind == "pytorchjob":
        pods = [r["template"]["spec"] for r in doc["spec"]["pytorchReplicaSpecs"].values()]
    else:
        pods = [doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]]
    return [(p.get("terminationGracePeriodSeconds"),
             {e["name"]: e["value"] for e in p["containers"][0]["env"]}) for p in pods]


def _slurm_signal_s(plan: Plan) -> int:
    [text] = export_plan(get_target("slurm"), plan, plan.model_spec(),
                         LaunchOptions(gpus_per_node=8)).values()
    return int(SIGNAL.search(text)[1])


def _slow() -> Plan:
    """gpt3-175b on 64 GPUs, a batch of 1536: a step of minutes."""
    return CASES["megatron-3d"][0].replace(model="gpt3-175b", batch=Batch(1, 1536))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("plan", [CASES["dp-zero1"][0], _slow()], ids=["fast", "slow"])
def test_every_pod_gets_the_slurm_warnings_lead_to_stop(kind: str, plan: Plan):
    text, doc = _manifest(plan, kind)
    lead = stop_lead(plan, plan.model_spec(), 8).seconds_s
    assert lead == _slurm_signal_s(plan)  # one rule for both schedulers
    pods = _grace_and_env(kind, doc)
    assert len(pods) == (2 if kind == "pytorchjob" else 1)  # Master and Worker templates
    for grace, env in pods:
        assert grace == lead
        assert env[SHUTDOWN_ENV] == str(lead)  # torchrun waits as long before its SIGKILL
    command = _command(kind, doc)
    if kind == "jobset":
        assert "&& exec torchrun " in command  # torchrun is process 1: the pod's SIGTERM reaches it
    else:  # the pod's shell is process 1 and passes it on (test_kube_ending runs it)
        assert "&& run torchrun " in command and 'kill -TERM "$pid"' in command
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert f"Every pod gets terminationGracePeriodSeconds {lead} and {SHUTDOWN_ENV}={lead}" \
        in header


def _command(kind: str, doc: dict) -> str:
    if kind == "trainjob":
        return doc["spec"]["trainer"]["command"][2]
    if kind == "pytorchjob":
        return doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][
            0]["command"][2]
    return doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"][2]


def test_a_slow_plan_gets_more_than_kubernetes_default():
    fast = _grace_and_env("jobset", _manifest(CASES["dp-zero1"][0], "jobset")[1])[0][0]
    slow = _grace_and_env("jobset", _manifest(_slow(), "jobset")[1])[0][0]
    assert fast > 30 and slow > fast


def test_a_pod_is_not_capped_at_sbatchs_limit():
    """sbatch takes --signal up to 65535 s; a grace period has no such bound, so a plan priced
    elsewhere at a step of 1e6 s gets all of it, and says how it was sized."""
    plan = CASES["dp-zero1"][0].replace(cluster=ClusterRef("another-sites-h100", 16),
                                        predicted={"step_time_s": 1e6, "error_band": 0.0})
    text, doc = _manifest(plan, "jobset")
    [(grace, env)] = _grace_and_env("jobset", doc)
    assert grace == 1_000_000 + 120 and env[SHUTDOWN_ENV] == str(grace)
    assert _slurm_signal_s(plan) == 65535
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "Sized as one step, 1e+06 s + 0% as the plan's search predicted, plus 120 s" in header


def test_a_trainjob_says_which_trainer_takes_its_grace_period():
    text, _ = _manifest(CASES["dp-zero1"][0], "trainjob")
    header = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert "Kubeflow Trainer v2.3 or later, whose patches take terminationGracePeriodSeconds " \
           "(kubeflow/trainer#3324); on v2.2 delete the terminationGracePeriodSeconds line " \
           "under spec.runtimePatches" in header  # the line it names, not "that line"
