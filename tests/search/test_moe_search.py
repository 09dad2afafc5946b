"""Expert parallelism in the search: ep/etp enumerated for MoE models only, Megatron-Core's
folding rules counted by reason, and the Mixtral acceptance search picking an EP plan."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.commands import build_parser
from autoplan.errors import ConfigError
from autoplan.model_spec import PRESETS
from autoplan.plan_rules import RULE_KEYS, first_violation
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.space import enumerate_space, expert_pairs, joint_rows
from autoplan.search_space import load_space, space_from_dict


def _request(*args: str):
    return build_request(build_parser().parse_args(["search", *args]))


def test_dense_model_enumerates_ep_1_only():
    req = _request("--model", "gpt3-1.3b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "16",
                   "--global-batch-size", "64")
    enum = enumerate_space(req.space, req.model, req.gpu_counts, req.global_batch_size)
    assert (enum.table["ep"] == 1).all() and (enum.table["etp"] == 1).all()
    assert len(enum.table["dp"]) == joint_rows(req.space, req.model, req.gpu_counts, req.batch)


def test_moe_default_ep_values_divide_the_experts():
    space = load_space("default")
    assert [e for e, _ in expert_pairs(space, PRESETS["mixtral-8x7b"])] == [1, 2, 4, 8]
    assert [e for e, _ in expert_pairs(space, PRESETS["deepseek-v3"])] == [1, 2, 4, 8, 16, 32,
                                                                            64]
    assert expert_pairs(space, PRESETS["llama-3-8b"]) == [(1, 1)]


def test_ep_rules_are_counted_by_reason():
    model = PRESETS["mixtral-8x7b"]
    one = {k: np.array([v]) for k, v in dict(
        dp=4, tp=1, pp=1, cp=1, vpp=1, sp=False, schedule=1, zero_stage=1,
        offload_optimizer=False, offload_params=False, recompute=0, recompute_layers=-1,
        mbs=1, gbs=64, layers_max=32, layers_first=32, layers_last=32).items()}
    table = {k: np.repeat(v, 3) for k, v in one.items()}
    table["ep"], table["etp"] = np.array([16, 8, 4]), np.array([1, 1, 2])
    keys = [RULE_KEYS[i] if i >= 0 else None for i in first_violation(table, model)]
    # 16 experts-parallel ranks for 8 experts; 8 x 1 does not divide dp*cp*tp = 4; 4 x 2 neither
    assert keys == ["ep-divides-experts", "ep-etp-divides-dp-cp-tp", "ep-etp-divides-dp-cp-tp"]
    # under HSDP the experts fold into one shard group: dp_shard * cp * tp = 2 holds ep 2, not 4
    hsdp = {**table, "ep": np.array([2, 4, 4]), "etp": np.array([1, 1, 1]),
            "dp_shard": np.array([2, 2, 0])}
    keys = [RULE_KEYS[i] if i >= 0 else None for i in first_violation(hsdp, model)]
    assert keys == [None, "ep-etp-divides-hsdp-shard", None]
    dense = {**table, "ep": np.array([2, 1, 1]), "etp": np.array([1, 1, 1])}
    keys = [RULE_KEYS[i] if i >= 0 else None for i in first_violation(dense, PRESETS["tiny"])]
    assert keys[0] == "ep-needs-moe" and keys[1:] == [None, None]


def test_space_ep_lists_load_strictly():
    space = space_from_dict({"name": "x", "parallel": {"ep": [1, 8], "etp": [1, 2]}})
    assert expert_pairs(space, PRESETS["mixtral-8x7b"]) == [(1, 1), (1, 2), (8, 1), (8, 2)]
    with pytest.raises(ConfigError) as err:
        space_from_dict({"name": "x", "parallel": {"ep": [0]}})
    assert "ep" in str(err.value)


def test_mixtral_acceptance_search_returns_an_ep_plan():
    req = _request("--model", "mixtral-8x7b", "--cluster", "h100-sxm-80gb", "--num-gpus", "64",
                   "--global-batch-size", "512")
    result = run_search(req)
    assert result.best is not None
    table = result.scored.cols
    ep = int(table["ep"][result.best])
    assert ep > 1 and PRESETS["mixtral-8x7b"].moe.num_experts % ep == 0
    assert int(table["etp"][result.best]) == 1
