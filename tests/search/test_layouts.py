"""Pipeline layouts in the exhaustive search: uneven splits listed with the layer columns the
cost model prices, the winner's plan.yaml carrying its layers_per_stage, and pp 16 for
Llama-3.1-405B's 126 layers (issue #12 item 1)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.model_spec import load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Schedule
from autoplan.plan_files import load_plan
from autoplan.plan_table import SCHEDULES, ZERO_BUBBLE, plan_to_row, stages_of_rank
from autoplan.search.engine import run_search
from autoplan.search.output import plans, summary, write_out
from autoplan.search.partition import (
    columns_of,
    ends_lighter_layers,
    heaviest_rank_flops,
    rank_stages,
    stage_layers,
)
from autoplan.search.space import enumerate_space, pipeline_shapes
from autoplan.search_space import Split, load_space, space_from_dict
from tests.search.conftest import request

LLAMA_405B_SPACE = {  # the default space cut to Meta's layout family, so the test stays quick
    "schema_version": 1, "name": "llama-405b-pp",
    "parallel": {"tp": [8], "pp": [8, 16], "cp": [1]}, "sequence_parallel": [True],
    "pipeline": {"schedule": ["1f1b", "interleaved-1f1b"], "vpp": [1, 2, 3, 4],
                 "split": ["even", "balanced", "ends"]},
    "zero_stage": [1], "recompute": {"policy": ["none", "selective", "full"]},
    "micro_batch_size": [1], "precision": "auto",
}


def test_ends_lighter_split_is_the_practitioners_llama_405b_layout() -> None:
    lps = ends_lighter_layers(126, 16)
    assert lps is not None and sum(lps) == 126 and len(lps) == 16
    assert lps[0] == lps[-1] == min(lps) and max(lps) - min(lps) == 1
    assert all(n == max(lps) for n in lps[1:-1])
    for layers, stages in itertools.product(range(3, 60), range(3, 20)):
        got = ends_lighter_layers(layers, stages)
        if got is None:
            continue
        assert sum(got) == layers and min(got) >= 1 and got[0] <= min(got[1:-1])
        assert got[-1] <= min(got[1:-1]) and max(got) - min(got) <= 2
    assert ends_lighter_layers(4, 4) is None  # an end stage would be empty
    assert ends_lighter_layers(10, 2) is None  # two stages have no middle


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize("pp,vpp", [(2, 1), (4, 2), (3, 3), (8, 2)])
def test_rank_stages_match_the_plan_tables_placement(schedule: Schedule, pp: int,
                                                     vpp: int) -> None:
    plan = Plan(model="tiny", cluster=ClusterRef("cpu-gloo", pp), batch=Batch(1, 8),
                parallel=Parallel(pp=pp), pipeline=Pipeline(schedule, vpp))
    ours = rank_stages(pp, vpp, SCHEDULES.index(schedule) == ZERO_BUBBLE)
    assert ours == [stages_of_rank(plan, r) for r in range(pp)]


def test_listed_split_columns_are_what_plan_to_row_prices() -> None:
    model = load_model("llama-3.1-405b")
    space = space_from_dict(LLAMA_405B_SPACE)
    for pp in (8, 16):
        for code, vpp, split, first, most, last, smallest in pipeline_shapes(space, model,
                                                                             int(pp)):
            if split == 0:
                continue
            lps = stage_layers(model, int(pp), int(vpp), list(Split)[split].value)
            assert lps is not None and sum(lps) == 126
            plan = Plan(model="llama-3.1-405b", cluster=ClusterRef("h100-sxm-80gb", int(pp)),
                        batch=Batch(1, 64), parallel=Parallel(pp=int(pp)),
                        pipeline=Pipeline(SCHEDULES[code], int(vpp), lps))
            row = plan_to_row(plan, model)
            assert (row["layers_first"][0], row["layers_max"][0], row["layers_last"][0],
                    row["chunk_min"][0]) == (first, most, last, smallest)


def test_uneven_splits_listed_only_where_they_lighten_the_heaviest_rank() -> None:
    model = load_model("gpt3-175b")  # 96 layers divide evenly on every power-of-two pp
    space = load_space("default")
    for pp in (2, 4, 8, 16):
        for code, vpp, split, *_ in pipeline_shapes(space, model, pp):
            if split == 0 or model.num_layers % (pp * vpp):
                continue
            lps = stage_layers(model, pp, int(vpp), list(Split)[split].value)
            even = (model.num_layers // (pp * vpp),) * (pp * vpp)
            zb = code == ZERO_BUBBLE
            assert lps is not None and heaviest_rank_flops(model, lps, pp, int(vpp), zb) \
                < heaviest_rank_flops(model, even, pp, int(vpp), zb)
            assert columns_of(lps, pp, int(vpp), zb) != (model.num_layers // pp,) * 3


def test_llama_405b_default_space_lists_pp16_with_uneven_splits() -> None:
    req = request("default", model="llama-3.1-405b", cluster="h100-sxm-80gb", gpus=(16384,),
                  gbs=2048)
    enum = enumerate_space(req.space, req.model, req.gpu_counts, req.global_batch_size)
    t = enum.table
    pp16 = t["pp"] == 16
    assert pp16.any() and (pp16 & (t["split"] > 0)).any()
    assert 8 in set(t["vpp"][t["pp"] == 2].tolist())  # vpp reaches 8 where the layers allow
    # the default space keeps cp where seq/cp >= 1024 tokens: Llama 3.1's 8,192 allow cp 8,
    # the Llama 3 paper's 128K context cp 16
    assert max(t["cp"].tolist()) == 8 == max(req.space.cp_for(8192))
    assert max(req.space_given.cp_for(131072)) == 16


def test_uneven_winner_runs_through_plan_yaml_and_estimate(tmp_path: Path) -> None:
    req = request(LLAMA_405B_SPACE, model="llama-3.1-405b", cluster="h100-sxm-80gb",
                  gpus=(16384,), gbs=2048, sampler="exhaustive")
    res = run_search(req)
    c = res.scored.cols
    assert res.best is not None
    feasible_pp16 = res.scored.feasible & (c["pp"] == 16)
    assert feasible_pp16.any(), "126 layers on 16 stages: only uneven splits can do it"
    assert (c["split"][feasible_pp16] > 0).all()
    uneven = res.order[c["split"][res.order] > 0]
    winner = plans(res, uneven[:1])[0]
    lps = winner.pipeline.layers_per_stage
    assert lps is not None and sum(lps) == 126
    assert len(lps) == winner.parallel.pp * winner.pipeline.vpp
    est = estimate_plan(winner, runtime=res.scored.runtime)
    assert est.feasible
    assert est.tokens_per_s == pytest.approx(float(c["tokens_per_s"][uneven[0]]), rel=1e-9)
    out = tmp_path / "out"
    write_out(res, out, 5, False, summary(res, 5))
    best = plans(res, np.array([res.best]))[0]
    assert load_plan(out / "plan.yaml").pipeline.layers_per_stage \
        == best.pipeline.layers_per_stage
