"""The exported SLURM script around a real torchrun and `autoplan train` (one CPU rank, gloo):
SIGTERM to the srun step, as `#SBATCH --signal=TERM@N` sends it to every process of the step
and not to the batch shell, stops the ranks after a step; they save, torchrun exits 1, and
the script exits 0 naming the step saved, which is the newest checkpoint in the folder."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from autoplan.export.base import export_plan
from autoplan.export.launch import LaunchOptions
from autoplan.export.registry import get_target
from autoplan.plan_files import save_plan
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

SRUN = """#!/bin/bash
# srun as a test runs it: the step in a session of its own (SLURM signals the step's processes,
# not the batch shell), its process id where the test finds it
while [[ $1 == --* ]]; do shift; done
setsid "$@" &
echo $! > "$STEP_PID"
wait $!
"""


@pytest.mark.skipif(shutil.which("torchrun") is None or shutil.which("autoplan") is None,
                    reason="torchrun and autoplan must be on PATH, as on the job's nodes")
def test_a_sigterm_to_the_step_ends_the_job_0_with_the_saved_step(tmp_path: Path):
    plan_file = save_plan(make_plan(dp=1), tmp_path / "plan.yaml")
    plan = make_plan(dp=1)
    ckpt = tmp_path / "ckpt"
    opts = LaunchOptions(plan_path=str(plan_file), gpus_per_node=1, checkpoint_dir=str(ckpt),
                         steps=100_000, checkpoint_every=0)
    [text] = export_plan(get_target("slurm"), plan, plan.model_spec(), opts).values()
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    pid_file, err_file = tmp_path / "step.pid", tmp_path / "err.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "AUTOPLAN_"))}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "SLURM_JOB_NODELIST": "localhost",
            "SLURM_JOB_ID": "7", "STEP_PID": str(pid_file), "OMP_NUM_THREADS": "1"}
    with err_file.open("w") as err:
        job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                               stderr=err, text=True, cwd=tmp_path)
        step = None
        try:
            deadline = time.monotonic() + 200
            while job.poll() is None and time.monotonic() < deadline:
                if pid_file.exists() and re.search(r"^step +\d+ ", err_file.read_text(), re.M):
                    step = int(pid_file.read_text())
                    os.killpg(step, signal.SIGTERM)  # the step's processes, not the shell
                    break
                time.sleep(0.2)
            out, _ = job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                job.kill()
            if step is not None:
                try:
                    os.killpg(step, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    log = err_file.read_text()
    assert step is not None, log[-3000:]
    assert "SignalException" in log  # torchrun's own exit after passing SIGTERM on: status 1
    assert job.returncode == 0, log[-3000:]
    found = re.fullmatch(r"autoplan: the ranks stopped on SIGTERM after step (\d+) of 100000 and "
                         r"saved checkpoint step-(\d{8}) in (.+) \(the time-limit warning that "
                         r"--signal sets, or a scancel --signal=TERM\): submitting this "
                         r"script again resumes from it\n", out.splitlines(keepends=True)[-1])
    assert found, out[-2000:]
    assert int(found[1]) == int(found[2]) and found[3] == str(ckpt)
    saved = sorted(p.name for p in ckpt.iterdir())
    assert saved == [f"step-{int(found[1]):08d}"], saved  # the step file is gone, the save kept
