"""DeepSpeed export: DeepSpeed's own DeepSpeedConfig parses and checks the JSON (batch arithmetic
against the data-parallel size included); export -> import -> export round-trips."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.deepspeed import ds_config
from autoplan.export.importers import deepspeed_plan_dict, import_deepspeed
from autoplan.export.registry import get_target
from autoplan.plan import Batch, Offload, Parallel, Pipeline, Recompute, RecomputePolicy, Schedule

from .cases import CASES, plan
from .consumers import bash_syntax_ok

EXPRESSIBLE = [name for name, (_, ok) in CASES.items() if "deepspeed" in ok]
# Top-level keys in DeepSpeed's configuration reference (deepspeed.ai/docs/config-json/).
DOCUMENTED = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "activation_checkpointing",
    "pipeline",
    "tensor_parallel",
}


def _render(case: str) -> dict[str, str]:
    p = CASES[case][0]
    return export_plan(get_target("deepspeed"), p, p.model_spec(), ExportOptions(gpus_per_node=8))


def deepspeed_parse(cfg: dict, dp: int):
    """DeepSpeed's DeepSpeedConfig, told the data-parallel size the way an engine tells it."""
    config = pytest.importorskip("deepspeed.runtime.config")

    class Mpu:  # what deepspeed.initialize(mpu=...) supplies
        def get_data_parallel_world_size(self) -> int:
            return dp

    with mock.patch.object(config.dist, "get_rank", return_value=0):
        return config.DeepSpeedConfig(cfg, mpu=Mpu())


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_deepspeed_parses_the_config(case: str):
    p = CASES[case][0]
    cfg = json.loads(_render(case)["ds_config.json"])
    assert set(cfg) <= DOCUMENTED
    ds = deepspeed_parse(cfg, p.parallel.dp)
    assert ds.train_batch_size == p.batch.global_batch_size
    assert ds.train_micro_batch_size_per_gpu == p.batch.micro_batch_size
    assert ds.gradient_accumulation_steps == p.num_microbatches
    assert ds.zero_optimization_stage == p.zero_stage
    zero = ds.zero_config
    assert (zero.offload_optimizer is not None) == p.offload.optimizer
    assert (zero.offload_param is not None) == p.offload.params
    assert ds.bfloat16_config.enabled == (p.precision.value == "bf16")
    assert ds.float16_config.enabled == (p.precision.value == "fp16")
    if p.parallel.pp > 1:
        assert ds.pipeline["stages"] == p.parallel.pp
        assert ds.pipeline["activation_checkpoint_interval"] == 1
    assert ds.tensor_parallel_config.autotp_size == (p.parallel.tp if p.parallel.tp > 1 else 0)


def test_deepspeed_rejects_inconsistent_batch():
    cfg = json.loads(_render("dp-zero1")["ds_config.json"])
    with pytest.raises(AssertionError, match="train_batch_size"):
        deepspeed_parse(cfg, dp=CASES["dp-zero1"][0].parallel.dp * 2)


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_launch_command_is_valid_bash(tmp_path: Path, case: str):
    path = tmp_path / "launch.sh"
    path.write_text(_render(case)["launch.sh"])
    bash_syntax_ok(path)


@pytest.mark.parametrize("case", EXPRESSIBLE)
def test_export_import_export_round_trips(tmp_path: Path, case: str):
    p = CASES[case][0]
    first = _render(case)["ds_config.json"]
    path = tmp_path / "ds_config.json"
    path.write_text(first)
    back = import_deepspeed(path, model=str(p.model), cluster=p.cluster.profile, num_gpus=None)
    assert back == p
    again = export_plan(
        get_target("deepspeed"), back, back.model_spec(), ExportOptions(gpus_per_node=8)
    )
    assert again["ds_config.json"] == first


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"parallel": Parallel(dp=4, pp=4), "zero_stage": 2}, "supports ZeRO stage 0 or 1"),
        ({"recompute": Recompute(RecomputePolicy.SELECTIVE)}, "attention-only recompute"),
        ({"parallel": Parallel(dp=8, cp=2)}, "Ulysses"),
        (
            {"parallel": Parallel(dp=4, pp=4), "pipeline": Pipeline(Schedule.INTERLEAVED_1F1B, 2)},
            "non-interleaved 1F1B",
        ),
        ({"offload": Offload(params=True), "zero_stage": 2}, "needs zero_stage 3"),
        ({"batch": Batch(3, 100)}, "not a multiple"),
    ],
)
def test_refusals_name_the_reason(changes: dict, why: str):
    p = plan(**changes)
    with pytest.raises(ConfigError, match=why) as err:
        export_plan(get_target("deepspeed"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert err.value.exit_code == 2


def test_import_fills_batch_keys_deepspeed_may_derive():
    data = deepspeed_plan_dict(
        {"train_batch_size": 64, "gradient_accumulation_steps": 4, "bf16": {"enabled": True}},
        num_gpus=16,
        what="t",
    )
    assert data["parallel"]["dp"] == 16 and data["batch"]["micro_batch_size"] == 1


@pytest.mark.parametrize(
    ("cfg", "why"),
    [
        ({"train_batch_size": "auto"}, "auto"),
        (
            {
                "train_batch_size": 64,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 3,
            },
            "not a multiple",
        ),
        (
            {
                "train_batch_size": 8,
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}},
            },
            "nvme",
        ),
        ({"train_batch_size": 8}, "--num-gpus"),
    ],
)
def test_import_rejects_what_a_plan_cannot_hold(cfg: dict, why: str):
    with pytest.raises(ConfigError, match=why):
        deepspeed_plan_dict(cfg, num_gpus=None, what="t")


def test_config_dict_matches_rendered_json():
    p = CASES["dp-zero1"][0]
    assert json.loads(_render("dp-zero1")["ds_config.json"]) == ds_config(p)
