"""A PyTorchJob's and a TrainJob's pods restart after a clean stop short of --steps: each pod's
script, run for real under dash (sh where dash is missing) against a fake torchrun, exits 75
after such a stop with a line saying so, 0 with every step trained though torchrun exited 1,
torchrun's status after a crash, and passes a SIGTERM to its shell on to torchrun. A JobSet's
pods keep `exec torchrun` (its eviction rule must see the other pods end 0)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoplan.export.base import export_plan
from autoplan.export.kube_ending import RESTART_STATUS
from autoplan.export.kube_pods import PLAN_FILE
from autoplan.export.launch import LaunchOptions
from autoplan.export.registry import get_target
from autoplan.runtime.checkpoint_names import SAVED_STEP_ENV

from .cases import CASES
from .test_kubernetes import validate

SH = shutil.which("dash") or shutil.which("sh") or "sh"
STEPS = 20
FAKE_TORCHRUN = """#!/bin/sh
# a stand-in for torchrun: rank 0 names $FAKE_STEP as saved (if set), then exit $FAKE_STATUS;
# with FAKE_WAIT, only once SIGTERM came (passed on by the pod's shell)
end() { [ -z "$FAKE_STEP" ] || echo "$FAKE_STEP" > "$AUTOPLAN_SAVED_STEP_FILE"; exit "$FAKE_STATUS"; }
if [ -n "$FAKE_WAIT" ]; then
  trap 'echo TERM > "$FAKE_WAIT.term"; end' TERM
  : > "$FAKE_WAIT"
  while :; do sleep 0.05; done
fi
end
"""


def _manifest(kind: str, case: str = "megatron-3d", **kw: Any) -> tuple[str, dict]:
    p = CASES[case][0]
    opts = LaunchOptions(gpus_per_node=8, k8s_kind=kind, steps=STEPS,
                         checkpoint_dir="/checkpoints", job_name="llm", **kw)
    [text] = export_plan(get_target("kubernetes"), p, p.model_spec(), opts).values()
    doc = yaml.safe_load(text)
    validate(kind, doc)  # the published API models read every field written
    return text, doc


def _containers(kind: str, doc: dict) -> list[dict]:
    if kind == "trainjob":
        return [doc["spec"]["trainer"]]
    if kind == "pytorchjob":
        return [r["template"]["spec"]["containers"][0]
                for r in doc["spec"]["pytorchReplicaSpecs"].values()]
    return [doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]]


def _header(text: str) -> str:
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


class Pod:
    """A PyTorchJob pod's script as `sh -c` runs it, with a fake torchrun on PATH, the plan
    written under tmp_path, and the saved-step file there instead of the claim's folder."""

    def __init__(self, tmp_path: Path, kind: str = "pytorchjob", case: str = "megatron-3d"):
        _, doc = _manifest(kind, case, pvc="ckpt")
        container = _containers(kind, doc)[0]
        self.env_written = {e["name"]: e["value"] for e in container["env"]}
        self.script = container["command"][2].replace(PLAN_FILE, str(tmp_path / "plan.yaml"))
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "torchrun").write_text(FAKE_TORCHRUN)
        (bin_dir / "torchrun").chmod(0o755)
        self.saved = tmp_path / "saved-step"
        self.env = {**os.environ, **self.env_written, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    SAVED_STEP_ENV: str(self.saved)}

    def start(self, **fake: str) -> subprocess.Popen:
        return subprocess.Popen([SH, "-c", self.script], env={**self.env, **fake},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, step: str, status: int) -> tuple[int, str]:
        proc = self.start(FAKE_STEP=step, FAKE_STATUS=str(status))
        out, err = proc.communicate(timeout=20)
        return proc.returncode, out


@pytest.mark.parametrize("torchrun_status", [0, 1])  # 1: the evicted pod's torchrun
def test_a_clean_stop_short_of_the_steps_exits_75_with_a_line(tmp_path: Path,
                                                               torchrun_status: int):
    pod = Pod(tmp_path)
    assert pod.env_written[SAVED_STEP_ENV] == "/checkpoints/autoplan-saved-step-llm"
    code, out = pod.run("7", torchrun_status)
    assert code == RESTART_STATUS == 75
    assert out == (f"autoplan: the ranks stopped on SIGTERM after step 7 of {STEPS} and saved "
                   "checkpoint step-00000007 in /checkpoints (a pod of this job was evicted, "
                   "preempted, drained or deleted): exiting 75; restartPolicy OnFailure "
                   "restarts this container, which resumes from it\n")
    assert pod.saved.read_text() == "7\n"  # several pods: kept for the others to read


def test_every_step_trained_exits_0_though_torchrun_exited_1(tmp_path: Path):
    pod = Pod(tmp_path)
    code, out = pod.run(str(STEPS), 1)
    assert code == 0
    assert out == (f"autoplan: trained all {STEPS} steps and saved checkpoint step-00000020 in "
                   "/checkpoints; torchrun's status was 1 (torchrun exits 1 after passing on a "
                   "SIGTERM)\n")
    assert pod.run(str(STEPS), 0) == (0, "")  # torchrun's 0: nothing to say


@pytest.mark.parametrize("status", [0, 3])
def test_without_the_file_the_pod_ends_with_torchruns_status(tmp_path: Path, status: int):
    """A crash, or ranks killed before their save: no step named, torchrun's status stands."""
    assert Pod(tmp_path).run("", status) == (status, "")


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("crash", [1, 3])
def test_a_crash_after_an_earlier_clean_stop_keeps_torchruns_status(tmp_path: Path, kind: str,
                                                                    crash: int):
    """Several pods keep the file, so an earlier attempt's stop is still in it; a line that
    reads as it did when the script started is not this attempt's (it used to exit 75)."""
    pod = Pod(tmp_path, kind)
    assert pod.run("7", 1)[0] == RESTART_STATUS  # the earlier attempt: a clean stop
    assert pod.run("", crash) == (crash, "")  # then a crash: rank 0 wrote nothing
    assert pod.saved.read_text() == "7\n"  # kept for the other pods all the same
    assert pod.run("", 0) == (0, "")  # ended 0 naming no step: torchrun's status, silent
    code, out = pod.run("9", 1)  # a later clean stop changes the line: this attempt's
    assert code == RESTART_STATUS and "after step 9 of 20" in out
    assert pod.run(str(STEPS), 1)[0] == 0  # every step trained, though torchrun exited 1


def test_one_pod_removes_an_earlier_jobs_file_first(tmp_path: Path):
    pod = Pod(tmp_path, case="single-node-tp")  # one pod of 4 GPUs
    pod.saved.write_text("3\n")  # an earlier job's clean stop, under the same name
    assert pod.run("", 0) == (0, "")  # not read as this run's stop
    assert pod.run("4", 0)[0] == RESTART_STATUS
    assert not pod.saved.exists()  # read and removed: no later start reads it


@pytest.mark.timeout(60)
def test_sigterm_to_the_pods_shell_reaches_torchrun(tmp_path: Path):
    """The shell is the container's process 1, which the kubelet SIGTERMs; it must pass the
    signal on (an untrapped one would end the test's shell, and a process 1 ignores it)."""
    pod = Pod(tmp_path)
    ready = tmp_path / "torchrun-started"
    proc = pod.start(FAKE_STEP="5", FAKE_STATUS="1", FAKE_WAIT=str(ready))
    deadline = time.monotonic() + 20
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists(), proc.communicate(timeout=5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert Path(f"{ready}.term").read_text() == "TERM\n"  # the fake torchrun got it
    assert proc.returncode == RESTART_STATUS, err
    assert "stopped on SIGTERM after step 5 of 20" in out


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_restarting_kinds_say_how_a_pod_ends(kind: str):
    text, doc = _manifest(kind)
    header = _header(text)
    assert "passes SIGTERM on to torchrun" in header
    assert f"exits {RESTART_STATUS}, and restartPolicy OnFailure restarts the container" in header
    assert "/checkpoints/autoplan-saved-step-llm" in header
    assert "No claim is shared by the" in header  # no --pvc: only rank 0's pod sees the file
    assert "an earlier attempt's, and the pod ends with torchrun's status" in header
    assert ("the node Job's backoffLimit" in header) == (kind == "trainjob")
    for container in _containers(kind, doc):
        assert any(line.strip() == "run() {" for line in container["command"][2].splitlines())
    assert re.search(r"\n *run\(\) \{\n", text)  # a YAML literal block, readable as written
    if kind == "pytorchjob":  # every replica restarts in place
        assert {r["restartPolicy"] for r in doc["spec"]["pytorchReplicaSpecs"].values()} == {
            "OnFailure"}
    assert "No claim is shared" not in _header(_manifest(kind, pvc="ckpt")[0])


def test_a_jobset_keeps_exec_torchrun_and_no_step_file():
    """A JobSet restarts every pod on an eviction (its failure rule); a pod ending non-zero
    after a clean stop would fail the Job for a reason that rule does not match."""
    text, doc = _manifest("jobset")
    [container] = _containers("jobset", doc)
    assert " && exec torchrun " in container["command"][2]
    assert SAVED_STEP_ENV not in {e["name"] for e in container["env"]}
    assert "Ending:" not in _header(text)
