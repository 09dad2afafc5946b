"""#14 items 13 and 14 through the real CLI (2 ranks, torchrun): Ctrl-C, SIGTERM and kill -9 of one
rank leave no live process and no temporary checkpoint, the metrics file has each step once,
and the resumed run ends at the uninterrupted run's final loss, bitwise."""

from __future__ import annotations

import pytest

from autoplan.plan import save_plan
from tests.dist.interrupt import interrupt_and_resume, reference_loss
from tests.dist.parity import make_plan

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

STEPS = 10


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupts")
    plan = str(save_plan(make_plan(dp=2, zero=2), root / "plan.yaml"))
    return plan, reference_loss(plan, STEPS, root)


@pytest.mark.parametrize(("kind", "at_step", "code"),
                         [("sigint", 3, 130), ("sigterm", 4, 143), ("kill9", 5, 0)])
def test_interrupt_then_resume_matches_an_uninterrupted_run(job, tmp_path, kind, at_step, code):
    plan, ref = job
    res = interrupt_and_resume(plan, STEPS, tmp_path, kind, at_step)
    assert not res.problems(STEPS, ref), (res.problems(STEPS, ref), res.stderr[-3000:])
    assert res.codes[0] == code, res.stderr[-3000:]
    if kind != "kill9":
        last = [ln for ln in res.stderr.splitlines() if ln.startswith("autoplan train: error")]
        assert len(last) == 1 and "continue with --resume" in last[0], res.stderr[-3000:]
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
    kept = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert len(kept) <= 3 and kept[-1] == f"step-{STEPS:08d}", kept  # pruned to the newest 3
