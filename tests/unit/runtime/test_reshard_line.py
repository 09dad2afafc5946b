"""The line a resume under another layout logs names every degree that changed: a tiny-moe
checkpoint saved at dp 4 ep 2 and resumed at dp 2 tp 2 ep 1 said only "dp 4 -> 2, tp 1 -> 2"
(user test 34, finding 10); a checkpoint saved before ep, etp and dp_shard were recorded is not
guessed at."""

from __future__ import annotations

import json

from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Precision
from autoplan.runtime.checkpoint_compat import check_resumable, layout_changes
from autoplan.runtime.checkpoint_files import verify
from tests.unit.runtime.test_checkpoint_files import _save


def _moe_plan(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int = 1,
              vpp: int = 1, dp_shard: int | None = None) -> Plan:
    return Plan(model="tiny-moe", cluster=ClusterRef("cpu-gloo", dp * tp * pp * cp),
                batch=Batch(micro_batch_size=2, global_batch_size=16),
                parallel=Parallel(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp,
                                  dp_shard=dp_shard),
                pipeline=Pipeline(vpp=vpp), zero_stage=1 if dp_shard else 0,
                precision=Precision.FP32)


def test_a_resume_under_another_layout_names_ep_with_dp_and_tp(tmp_path):
    saved, now = _moe_plan(dp=4, ep=2), _moe_plan(dp=2, tp=2, ep=1)
    _save(tmp_path / "step-00000020", saved.model_spec(), step=20, plan=saved)
    line = check_resumable(verify(tmp_path / "step-00000020"), now, now.model_spec())
    assert line == ("resuming step 20 saved under another layout (dp 4 -> 2, tp 1 -> 2, "
                    "ep 2 -> 1): DCP reshards it")


def test_every_degree_that_changed_is_named_in_the_plans_order(tmp_path):
    saved = _moe_plan(dp=4, tp=2, ep=4, etp=2, dp_shard=2)
    now = _moe_plan(dp=2, pp=2, cp=2, ep=2, etp=1, vpp=2)
    _save(tmp_path / "step-00000005", saved.model_spec(), plan=saved)
    meta = json.loads((tmp_path / "step-00000005" / "meta.json").read_text())
    assert layout_changes(meta, now) == [
        "dp 4 -> 2", "dp_shard 2 -> None", "tp 2 -> 1", "pp 1 -> 2", "cp 1 -> 2", "ep 4 -> 2",
        "etp 2 -> 1", "vpp 1 -> 2", "zero_stage 1 -> 0"]
    assert layout_changes(meta, saved) == []  # the same layout: no line


def test_a_checkpoint_that_does_not_record_ep_is_not_said_to_change_it(tmp_path):
    saved = _moe_plan(dp=4, ep=2)
    _save(tmp_path / "step-00000005", saved.model_spec(), plan=saved)
    meta = json.loads((tmp_path / "step-00000005" / "meta.json").read_text())
    for key in ("ep", "etp", "dp_shard"):  # as checkpoints saved before they were recorded
        del meta["layout"][key]
    assert layout_changes(meta, _moe_plan(dp=2, tp=2, ep=1)) == ["dp 4 -> 2", "tp 1 -> 2"]
