"""The full parity product (`-m slow`): every valid combination of layout and knobs."""

from __future__ import annotations

import itertools

import pytest

from autoplan.runtime.validation import runtime_problems
from tests.dist.parity import make_plan
from tests.dist.test_parity import check_parity

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(600)]

FACTORISATIONS = [(dp, tp, pp) for n in (1, 2, 4, 8) for dp in (1, 2, 4, 8)
                  for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if dp * tp * pp == n]
SCHEDULES = [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1),
             ("zero-bubble", 2)]


def _rows():
    for (dp, tp, pp), sp, zero, offload, rc, (sched, vpp), optim in itertools.product(
        FACTORISATIONS, (False, True), (0, 1, 2, 3), (False, True),
        ("none", "selective", "full"), SCHEDULES, ("adamw", "sgd"),
    ):
        if (sp and tp == 1) or (pp == 1 and (sched, vpp) != ("1f1b", 1)):
            continue
        model = "tiny8-gpt" if max(tp, pp * vpp) > 4 else "tiny"
        row = dict(model=model, dp=dp, tp=tp, pp=pp, sp=sp, zero=zero, offload=offload,
                   recompute=rc, schedule=sched, vpp=vpp, mbs=1, gbs=dp * max(pp, 2))
        plan = make_plan(**row)
        if runtime_problems(plan, plan.model_spec()):
            continue
        yield f"{model}-dp{dp}tp{tp}pp{pp}-sp{int(sp)}-z{zero}-o{int(offload)}-{rc}-" \
              f"{sched}{vpp}-{optim}", {**row, "optim": optim}


ROWS = dict(_rows())


@pytest.mark.parametrize("name", list(ROWS))
def test_full_product_matches_single_process(pool, reference_cache, name):
    check_parity(pool, reference_cache, ROWS[name])
