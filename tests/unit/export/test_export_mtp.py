"""Multi-token prediction in exports: Megatron-LM writes and reads --mtp-num-layers (its own
argparse definition parses it); the targets that cannot state it refuse in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.registry import get_target
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan

from .consumers import megatron_parser, run_script


def _plan(model, gpus: int, **par) -> Plan:
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus),
                parallel=Parallel(**par), batch=Batch(micro_batch_size=1,
                                                      global_batch_size=8 * gpus), zero_stage=1)


def test_megatron_writes_and_reads_mtp_layers(tmp_path: Path):
    plan = _plan(PRESETS["llama-3-8b"].replace(mtp_layers=2), 8, dp=8)
    files = export_plan(get_target("megatron"), plan, plan.model_spec(),
                        ExportOptions(gpus_per_node=8))
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    [call] = run_script(path, {"torchrun": ""})
    ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
    assert ns.mtp_num_layers == 2
    back = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=None)
    assert back.model_spec().mtp_layers == 2
    plain = _plan("llama-3-8b", 8, dp=8)
    text = export_plan(get_target("megatron"), plain, plain.model_spec(),
                       ExportOptions(gpus_per_node=8))["megatron_args.sh"]
    assert "--mtp-num-layers" not in text


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan"])
def test_targets_without_mtp_refuse_it(target: str):
    plan = _plan(PRESETS["llama-3-8b"].replace(mtp_layers=1), 8, dp=8)
    with pytest.raises(ConfigError) as err:
        export_plan(get_target(target), plan, plan.model_spec(), ExportOptions(gpus_per_node=8))
    assert "mtp_layers=1" in str(err.value) and "\n" not in str(err.value)
