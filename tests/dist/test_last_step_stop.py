"""A SIGTERM that reaches a real `autoplan train --steps 1` while its rank starts lands on the
last step: the run trains it, saves it, and neither the summary nor the exit line advises
--resume, which would refuse a checkpoint at --steps (review finding H1.1)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from autoplan.plan_files import save_plan
from tests.dist.interrupt import OUTER_TIMEOUT_S, _env, _rank_pid, train_cmd
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def test_a_sigterm_on_the_last_step_finishes_the_run_without_resume_advice(tmp_path):
    plan = str(save_plan(make_plan(), tmp_path / "plan.yaml"))
    ck = tmp_path / "ck"
    proc = subprocess.Popen(train_cmd(plan, 1, ck, tmp_path / "m.jsonl"), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + OUTER_TIMEOUT_S
    while _rank_pid(str(ck), 0) is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)  # the rank is still importing torch: step 1 is ahead
    out, err = proc.communicate(timeout=OUTER_TIMEOUT_S)
    assert proc.returncode == 143, err[-3000:]
    summary = json.loads(out)
    assert summary["final_step"] == 1 and summary["stopped_early"] is None, summary
    assert "--resume" not in summary["note"] and "--steps 2 or more" in summary["note"]
    assert err.strip().splitlines()[-1] == (
        "autoplan train: warning: SIGTERM came as the run ended: step 1, the last of --steps 1, "
        f"finished; checkpoint step-00000001 saved in {ck}, nothing left to resume")
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000001"]
