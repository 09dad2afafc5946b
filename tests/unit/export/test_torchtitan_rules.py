"""`--to torchtitan` refuses what the torchtitan release it writes for cannot run: the runtime
rules of that release's traits (the ones `search --runtime` keeps to), and an --out whose module
name torchtitan would resolve to another module."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from autoplan.cost.runtime_rules import refusals
from autoplan.cost.runtimes import load_runtime
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.export.torchtitan import RUNTIMES
from autoplan.plan import Batch, Parallel, Pipeline, Precision, Schedule
from autoplan.plan_files import save_plan
from tests.cli_refusals import assert_refused

from .cases import plan

FORMATS = ("python", "toml")


def _zero0(dp: int, tp: int = 1, pp: int = 1, cp: int = 1):
    return plan("llama-3.1-8b", dp * tp * pp * cp, parallel=Parallel(dp=dp, tp=tp, pp=pp, cp=cp),
                sequence_parallel=tp > 1, zero_stage=0, precision=Precision.FP32,
                batch=Batch(1, 16))


def _export(p, fmt: str, out: str | None = None) -> dict[str, str]:
    return export_plan(get_target("torchtitan"), p, p.model_spec(),
                       ExportOptions(gpus_per_node=8, torchtitan_format=fmt, out=out))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("degrees", [(2, 2, 1, 1), (2, 1, 2, 1), (2, 1, 1, 2), (1, 1, 1, 2)],
                         ids=["dp-tp", "dp-pp", "dp-cp", "cp"])
def test_zero0_beside_another_parallelism_is_refused(tmp_path: Path, capsys, fmt: str,
                                                      degrees: tuple[int, ...]) -> None:
    """torchtitan replicates with DDP only when data parallelism is the sole dimension
    (0.2.2 parallelize.py: "DDP has not supported > 1D parallelism") and shards whenever cp > 1
    (ParallelDims.fsdp_enabled): ZeRO-0 beside tp, pp or cp is not the plan it would run."""
    path = save_plan(_zero0(*degrees), tmp_path / "plan.yaml")
    assert_refused(capsys, ["export", str(path), "--to", "torchtitan", "--torchtitan-format",
                            fmt], "ZeRO-0", f"dp={degrees[0]}", "set zero_stage 2 or 3")


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero0_as_the_sole_parallelism_replicates(fmt: str) -> None:
    [text] = _export(_zero0(4), fmt).values()
    assert "data_parallel_replicate_degree = 4" in text
    assert "data_parallel_shard_degree = 1" in text


def _grid():
    """Plans the plan rules accept, across the rules torchtitan's traits judge."""
    for (dp, tp, pp, cp), zero, sched in itertools.product(
            [(8, 1, 1, 1), (4, 2, 1, 1), (2, 2, 2, 1), (4, 1, 1, 2), (2, 1, 4, 1)], [0, 1, 2, 3],
            [(Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED_1F1B, 2),
             (Schedule.ZERO_BUBBLE, 1)]):
        if pp == 1 and sched[0] != Schedule.ONE_F_ONE_B:
            continue
        yield plan("llama-3.1-8b", 8, parallel=Parallel(dp=dp, tp=tp, pp=pp, cp=cp),
                   sequence_parallel=tp > 1, zero_stage=zero, pipeline=Pipeline(*sched),
                   batch=Batch(1, 64))


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_refuses_every_plan_its_runtime_rules_refuse(fmt: str) -> None:
    """The exporter and the planner share one rule set: no plan a search priced for this
    release would drop (runtime_rules.refusals) exports."""
    traits, judged = load_runtime(RUNTIMES[fmt]), 0
    for p in _grid():
        if not refusals(p, traits):
            continue
        judged += 1
        with pytest.raises(ConfigError):
            _export(p, fmt)
    assert judged >= 10


def test_formats_are_priced_as_the_release_they_run() -> None:
    from autoplan.export.pricing import TARGET_RUNTIMES

    assert TARGET_RUNTIMES["torchtitan/python"] == RUNTIMES["python"]
    assert TARGET_RUNTIMES["torchtitan"] == RUNTIMES["toml"]


@pytest.mark.parametrize("name", ["llama3", "qwen3", "deepseek_v3", "flux", "json", "torch",
                                  "torchtitan"])
def test_out_named_like_a_module_torchtitan_finds_first_is_refused(tmp_path: Path, capsys,
                                                                  name: str) -> None:
    """torchtitan 0.3.0 resolves --module llama3 to torchtitan.models.llama3.config_registry
    (config/manager.py), and a json.py or torch.py first on PYTHONPATH shadows the real one:
    the run line written would not run the exported config."""
    path = save_plan(plan("llama-3.1-8b", zero_stage=3), tmp_path / "plan.yaml")
    out = tmp_path / f"{name}.py"
    assert_refused(capsys, ["export", str(path), "--to", "torchtitan", "--out", str(out)],
                   f"--module {name}", f"{name}_job.py")
    assert not out.exists()
