"""MoESpec's routing fields (group-limited routing, gate scaling, the bias update rate):
strict one-line errors, saved files of models without them unchanged, the deepseek-v3 preset
and its Hugging Face config, and the router configs the importer refuses."""

from __future__ import annotations

import json

import pytest

from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS, load_model
from autoplan.moe_spec import MoESpec
from autoplan.plan import plan_from_dict
from autoplan.plan_files import plan_to_dict
from autoplan.yaml_io import dump_yaml, from_dict
from tests.dist.parity import make_plan
from tests.unit.test_moe_spec import DEEPSEEK_V3

BASE = {"num_experts": 8, "experts_per_token": 2, "expert_ffn_hidden_size": 8,
        "router_aux_free": True}


@pytest.mark.parametrize(("change", "field"), [
    ({"route_groups": 3}, "route_groups"),                         # does not divide 8
    ({"route_groups": 8, "route_groups_per_token": 2}, "route_groups"),  # 1 expert a group
    ({"route_groups": 4}, "route_groups_per_token"),               # missing
    ({"route_groups": 4, "route_groups_per_token": 5}, "route_groups_per_token"),
    ({"route_groups_per_token": 2}, "route_groups_per_token"),     # without groups
    ({"experts_per_token": 6, "route_groups": 4, "route_groups_per_token": 2},
     "route_groups_per_token"),                                    # 4 experts < 6
    ({"routed_scaling_factor": 0}, "routed_scaling_factor"),
    ({"routed_scaling_factor": "2.5"}, "routed_scaling_factor"),
    ({"router_bias_update_rate": -0.1}, "router_bias_update_rate"),
    ({"router_bias_update_rate": 0.01, "router_aux_free": False}, "router_bias_update_rate"),
])
def test_bad_routing_fields_are_one_line_errors(change, field):
    with pytest.raises(ConfigError) as err:
        from_dict(MoESpec, {**BASE, **change}, "model.moe")
    assert f"model.moe.{field}" in str(err.value) and "\n" not in str(err.value)


def test_models_without_the_fields_save_as_before():
    """A plan with an inline tiny-moe model has no routing keys; one that sets them keeps them
    and reads back equal."""
    plan = make_plan(load_model("tiny-moe"))
    text = dump_yaml(plan_to_dict(plan))
    for key in ("route_groups", "routed_scaling_factor", "router_bias_update_rate"):
        assert key not in text
    deep = make_plan(load_model("tiny-deepseek"))
    data = plan_to_dict(deep)
    assert data["model"]["moe"]["route_groups"] == 4
    assert data["model"]["moe"]["router_bias_update_rate"] == 0.01
    assert plan_from_dict(data) == deep


def test_deepseek_v3_preset_routes_as_its_config():
    moe = PRESETS["deepseek-v3"].moe
    assert moe.router_aux_free and moe.router_bias_update_rate == 0.001
    assert (moe.route_groups, moe.route_groups_per_token, moe.routed_scaling_factor) == (8, 4, 2.5)


def _load(tmp_path, cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


def test_hf_import_reads_the_router_keys(tmp_path):
    """huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json states them; a
    Moonlight-style config (one group) reads as no group limit."""
    full = {**DEEPSEEK_V3, "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 8,
            "topk_group": 4, "routed_scaling_factor": 2.5}
    assert _load(tmp_path, full).moe == PRESETS["deepseek-v3"].moe
    one = _load(tmp_path, {**full, "n_group": 1, "topk_group": 1,
                           "routed_scaling_factor": 2.446})
    assert (one.moe.route_groups, one.moe.route_groups_per_token) == (1, None)
    assert one.moe.routed_scaling_factor == 2.446


@pytest.mark.parametrize(("change", "field"), [
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"topk_method": "greedy"}, "topk_method"),
    ({"norm_topk_prob": False}, "norm_topk_prob"),
    ({"n_group": 1, "topk_group": 4}, "topk_group"),
    ({"n_group": 7}, "route_groups"),  # 7 does not divide 256
    ({"routed_scaling_factor": "big"}, "routed_scaling_factor"),
])
def test_hf_import_refuses_routers_autoplan_does_not_run(tmp_path, change, field):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, {**DEEPSEEK_V3, **change})
    assert field in str(err.value) and "\n" not in str(err.value)


def test_checkpoints_saved_before_the_fields_still_resume():
    """meta.json of a tiny-moe checkpoint written before the routing fields existed names the
    same model (runtime/checkpoint_compat.model_changes); a changed routing field does not."""
    from autoplan.runtime.checkpoint_compat import model_changes, model_fields

    spec = load_model("tiny-moe")
    old = model_fields(spec)
    assert "route_groups" not in old["moe"]
    assert not model_changes({"model": old}, spec)
    deep = spec.replace(moe=MoESpec(8, 2, 128, first_dense_layers=1, router_aux_free=True,
                                    route_groups=4, route_groups_per_token=2))
    assert model_changes({"model": old}, deep)
