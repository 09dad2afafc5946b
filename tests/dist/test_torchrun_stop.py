"""`--to torchrun`'s launch.sh around a real torchrun and `autoplan train` (one CPU rank, gloo):
a SIGTERM to the script's process group (kill -TERM -- -PGID, as timeout sends it) stops the
ranks after a step; they save, torchrun exits 1, and the script, which outlives the signal,
exits 0 naming the step saved, the newest checkpoint in the folder."""

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


@pytest.mark.skipif(shutil.which("torchrun") is None or shutil.which("autoplan") is None,
                    reason="torchrun and autoplan must be on PATH, as on the job's nodes")
def test_a_sigterm_to_the_script_ends_it_0_with_the_saved_step(tmp_path: Path):
    plan = make_plan(dp=1)
    plan_file = save_plan(plan, tmp_path / "plan.yaml")
    ckpt = tmp_path / "ckpt"
    opts = LaunchOptions(plan_path=str(plan_file), gpus_per_node=1, checkpoint_dir=str(ckpt),
                         steps=100_000, checkpoint_every=0)
    [text] = export_plan(get_target("torchrun"), plan, plan.model_spec(), opts).values()
    script = tmp_path / "launch.sh"
    script.write_text(text)
    err_file = tmp_path / "err.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPLAN_")}
    env["OMP_NUM_THREADS"] = "1"
    with err_file.open("w") as err:
        job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE,
                               stderr=err, text=True, cwd=tmp_path, start_new_session=True)
        signalled = False
        try:
            deadline = time.monotonic() + 200
            while job.poll() is None and time.monotonic() < deadline:
                if re.search(r"^step +\d+ ", err_file.read_text(), re.M):
                    os.killpg(job.pid, signal.SIGTERM)  # the script, torchrun and the rank
                    signalled = True
                    break
                time.sleep(0.2)
            out, _ = job.communicate(timeout=120)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    log = err_file.read_text()
    assert signalled, log[-3000:]
    assert "SignalException" in log  # torchrun's own exit after passing SIGTERM on: status 1
    assert job.returncode == 0, log[-3000:]
    found = re.fullmatch(r"autoplan: the ranks stopped on a signal after step (\d+) of 100000 "
                         r"and saved checkpoint step-(\d{8}) in (.+) \(SIGTERM or Ctrl-C\): "
                         r"running this script again resumes from it\n",
                         out.splitlines(keepends=True)[-1])
    assert found, out[-2000:]
    assert int(found[1]) == int(found[2]) and found[3] == str(ckpt)
    saved = sorted(p.name for p in ckpt.iterdir())
    assert saved == [f"step-{int(found[1]):08d}"], saved  # the step file is gone, the save kept
