"""#15 item 4: the elastic re-plan as a pure function (plan + ranks present -> the plan for the
largest world that has one, or exit 3 with the nearest miss), its saved file, and the
`train --elastic` flag checks."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError, NoFeasiblePlanError
from autoplan.plan_files import load_plan, save_plan
from autoplan.runtime.elastic import (
    describe,
    from_text,
    plan_objectives,
    plan_runtime,
    replan,
    save_replan,
    to_text,
)
from autoplan.runtime.validation import check_plan, runtime_problems
from tests.dist.parity import make_plan


def test_the_plan_itself_when_its_world_is_present():
    plan = make_plan(dp=4, zero=2)
    r = replan(plan, 4)
    assert r.plan is plan and not r.changed and r.idle_ranks == () and r.skipped == ()


SMALL = "small-cpu"
"""A space without pp 3 or the embed-loss split: there a 2-layer model has no 3-rank plan."""


def test_three_of_four_runs_on_two_with_one_rank_idle():
    """gbs 8 does not split over dp 3, pp 3 is not in the space, 8 heads not over tp 3: no plan
    for 3 ranks; the largest smaller world with one is 2."""
    plan = make_plan("h8-2l", dp=4, zero=2)
    r = replan(plan, 3, space=SMALL)
    assert r.world_size == 2 and r.changed and r.idle_ranks == (2,)
    assert [w for w, _ in r.skipped] == [3] and "divisible by dp=3" in r.skipped[0][1]
    new = r.plan
    assert new.model == plan.model and new.batch.global_batch_size == 8
    assert new.precision == plan.precision and new.cluster.profile == plan.cluster.profile
    assert new.cluster.num_gpus == 2 and new.predicted["tokens_per_s"] > 0
    assert runtime_problems(new, new.model_spec()) == []
    check_plan(new, new.model_spec(), 2)  # the runtime accepts it for 2 processes
    block = describe(r, "plan.yaml")
    assert "no feasible plan for 3 ranks" in block and "new plan for 2 ranks" in block
    assert "rank(s) 2 idle" in block and "tokens/s" in block


def test_the_new_plan_is_what_search_picks_for_that_world(capsys):
    """Same model, global batch, profile and (default) space as `autoplan search` for the
    world it picks (3 for the tiny model: an uneven 1-2-1 pipeline split of its 4 layers)."""
    r = replan(make_plan(dp=4, zero=2), 3)
    code = main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus",
                 str(r.world_size), "--global-batch-size", "8", "--format", "json"])
    assert code == 0
    best = json.loads(capsys.readouterr().out)["best"]
    p = r.plan
    assert {k: best["parallel"][k] for k in ("dp", "tp", "pp", "cp")} == {
        "dp": p.parallel.dp, "tp": p.parallel.tp, "pp": p.parallel.pp, "cp": p.parallel.cp}
    assert best["pipeline"]["schedule"] == p.pipeline.schedule.value
    assert best["batch"]["micro_batch_size"] == p.batch.micro_batch_size
    assert best["zero_stage"] == p.zero_stage


def test_a_larger_world_grows_the_plan():
    r = replan(make_plan(dp=2, zero=1), 4)
    assert r.world_size == 4 and r.changed and r.idle_ranks == ()


def test_the_default_space_runs_three_ranks_as_embedding_blocks_and_loss_stages():
    """The default space's embed-loss split gives a 2-layer model a 3-rank pipeline: the
    embedding, both blocks and the loss each on a rank of their own (issue #12)."""
    r = replan(make_plan("h8-2l", dp=4, zero=2), 3)
    assert r.world_size == 3 and r.idle_ranks == ()
    assert r.plan.parallel.pp == 3 and r.plan.pipeline.layers_per_stage == (0, 2, 0)


def test_no_world_down_to_min_gpus_is_exit_3_with_the_nearest_miss():
    with pytest.raises(NoFeasiblePlanError) as err:
        replan(make_plan("h8-2l", dp=4), 3, min_world=3, space=SMALL)
    assert err.value.exit_code == 3
    assert "at 3:" in str(err.value) and "divisible by dp=3" in str(err.value)
    with pytest.raises(NoFeasiblePlanError, match="fewer than --min-gpus 4"):
        replan(make_plan(dp=4), 3, min_world=4)


def test_objectives_and_runtime_come_from_the_plans_prediction():
    plan = make_plan("h8-2l", dp=4).replace(
        predicted={"objective_latency": 1.0, "runtime": "autoplan-cpu"})
    assert plan_objectives(plan) == ("latency",) and plan_runtime(plan) == "autoplan-cpu"
    assert plan_objectives(make_plan()) == ("throughput",) and plan_runtime(make_plan()) is None
    assert replan(plan, 3).plan.predicted.get("objective_latency") is not None


def test_saved_replans_are_never_overwritten(tmp_path):
    r = replan(make_plan("h8-2l", dp=4, zero=2), 3, space=SMALL)
    first = save_replan(r, tmp_path)
    assert first.name == "plan-2gpus.yaml" and load_plan(first) == r.plan
    assert save_replan(r, tmp_path) == first  # the same plan again (a restart): reused
    other = r.__class__(r.plan.replace(zero_stage=3), r.present, r.original_world)
    second = save_replan(other, tmp_path)
    assert second.name == "plan-2gpus-2.yaml" and load_plan(first) == r.plan
    assert from_text(to_text(r.plan)) == r.plan


@pytest.mark.parametrize(("flags", "field"), [
    (["--min-gpus", "2"], "--min-gpus"),
    (["--elastic"], "--checkpoint-dir"),
    (["--elastic", "--checkpoint-dir", "{ck}", "--min-gpus", "0"], "--min-gpus"),
    (["--elastic", "--checkpoint-dir", "{ck}", "--space", "no-such-space"], "space"),
])
def test_bad_elastic_flags_exit_2_in_one_line(tmp_path, capsys, flags, field):
    plan = save_plan(make_plan(dp=2), tmp_path / "plan.yaml")
    flags = [f.format(ck=tmp_path / "ck") for f in flags]
    code = main(["train", str(plan), "--steps", "2", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and field in err, err


def test_train_elastic_with_no_plan_for_any_world_exits_3_before_launch(tmp_path, capsys):
    plan = save_plan(make_plan("h8-2l", dp=4), tmp_path / "plan.yaml")
    code = main(["train", str(plan), "--steps", "2", "--nproc", "3", "--elastic",
                 "--min-gpus", "3", "--checkpoint-dir", str(tmp_path / "ck"), "--space", SMALL])
    err = capsys.readouterr().err.strip()
    assert code == 3 and "divisible by dp=3" in err, err
    assert not (tmp_path / "ck").exists()


def test_an_unreadable_plan_text_is_a_config_error():
    with pytest.raises(ConfigError):
        from_text("[1, 2")


def test_the_block_names_a_few_skipped_worlds_then_counts_the_rest():
    from autoplan.runtime.elastic import Replan

    r = Replan(make_plan(dp=2), 9, 4, tuple((w, f"reason {w}") for w in range(9, 2, -1)))
    block = describe(r, "plan.yaml")
    assert "for 9 ranks: reason 9" in block and "for 7 ranks: reason 7" in block
    assert "reason 6" not in block and "4 more world sizes, 6 down to 3" in block
