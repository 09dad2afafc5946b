"""Megatron flags of DeepSeek-V3's router (export/megatron_moe.py): group-limited routing, the
gate scaling and the bias update rate are written as Megatron's own parser reads them and
imported back; what Megatron would route otherwise is refused in one line."""

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
from .test_megatron_moe import BASE

DEEPSEEK = Plan(model="deepseek-v3", cluster=ClusterRef("h100-sxm-80gb", 16),
                parallel=Parallel(dp=16, ep=16), batch=Batch(1, 128), zero_stage=1)


def _export(tmp_path: Path, p: Plan) -> Path:
    files = export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    return path


def test_deepseek_v3_router_flags_parse(tmp_path: Path):
    [call] = run_script(_export(tmp_path, DEEPSEEK), {"torchrun": ""})
    ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
    assert ns.moe_router_enable_expert_bias and ns.moe_router_score_function == "sigmoid"
    assert (ns.moe_router_num_groups, ns.moe_router_group_topk) == (8, 4)
    assert ns.moe_router_topk_scaling_factor == 2.5
    assert ns.moe_router_bias_update_rate == 1e-3


def test_router_flags_import(tmp_path: Path):
    path = tmp_path / "args.txt"
    path.write_text(BASE + "--num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 128 "
                    "--moe-router-score-function sigmoid --moe-router-enable-expert-bias "
                    "--moe-router-bias-update-rate 0.002 --moe-router-num-groups 4 "
                    "--moe-router-group-topk 2 --moe-router-topk-scaling-factor 1.5")
    moe = import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=8).model_spec().moe
    assert moe.router_aux_free and moe.router_bias_update_rate == 0.002
    assert (moe.route_groups, moe.route_groups_per_token, moe.routed_scaling_factor) == (4, 2, 1.5)


@pytest.mark.parametrize(("extra", "field"), [
    ("--moe-router-enable-expert-bias", "--moe-router-score-function"),  # softmax + bias
    ("--moe-router-score-function sigmoid", "--moe-router-score-function"),  # no bias
    ("--moe-router-score-function sigmoid --moe-router-enable-expert-bias "
     "--moe-router-num-groups 3 --moe-router-group-topk 2", "route_groups"),  # 3 does not divide 8
])
def test_router_flags_autoplan_cannot_model_are_refused(tmp_path: Path, extra: str, field: str):
    path = tmp_path / "args.txt"
    path.write_text(BASE + "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 128 " + extra)
    with pytest.raises(ConfigError) as err:
        import_megatron(path, model=None, cluster="h100-sxm-80gb", num_gpus=8)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_group_scores_megatron_computes_otherwise_are_refused():
    """tiny-deepseek routes top-2 over 2 of 4 groups: Megatron would score each group by
    its top 2 / 2 = 1 expert, DeepSeek-V3 by its top 2."""
    p = Plan(model="tiny-deepseek", cluster=ClusterRef("h100-sxm-80gb", 2),
             parallel=Parallel(dp=2, ep=2), batch=Batch(1, 8))
    assert PRESETS["tiny-deepseek"].moe.route_groups == 4
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("megatron"), p, p.model_spec(), ExportOptions(gpus_per_node=8))
    assert "route_groups=4" in str(err.value) and "\n" not in str(err.value)
