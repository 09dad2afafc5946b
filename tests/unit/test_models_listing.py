"""`autoplan models` says what a MoE preset is (user test 37, finding 7): experts x expert ffn,
top-k, shared experts and active parameters (the cost model's own counts), and no dense ffn
where every block routes (Qwen3-30B-A3B's 6144 is config.json's, unused)."""

from __future__ import annotations

import json

from autoplan.commands import main
from autoplan.cost.params import active_params, total_params
from autoplan.model_spec import PRESETS


def _models(capsys, fmt: str) -> str:
    assert main(["models", "--format", fmt]) == 0
    return capsys.readouterr().out


def test_json_gives_experts_active_params_and_only_a_used_dense_ffn(capsys) -> None:
    rows = {r["name"]: r for r in json.loads(_models(capsys, "json"))}
    qwen = rows["qwen3-30b-a3b"]
    assert qwen["experts"] == {"routed": 128, "ffn": 768, "top_k": 8, "shared": 0,
                               "moe_layers": 48}
    assert qwen["ffn"] is None and qwen["dense_layers"] == 0
    assert qwen["active"] == active_params(PRESETS["qwen3-30b-a3b"])
    assert 3.2e9 < qwen["active"] < 3.4e9  # the model card's 3.3B activated
    ds = rows["deepseek-v3"]  # three dense blocks first: their ffn is shown
    assert ds["ffn"] == 18432 and ds["dense_layers"] == 3
    assert ds["experts"]["shared"] == 1 and ds["experts"]["moe_layers"] == 58
    dense = rows["llama-3.1-8b"]
    assert dense["experts"] is None and dense["ffn"] == 14336
    assert dense["active"] == dense["params"] == total_params(PRESETS["llama-3.1-8b"])


def test_the_table_lists_moe_presets_apart_with_their_experts(capsys) -> None:
    out = _models(capsys, "table")
    dense, _, moe = out.partition("mixture-of-experts presets")
    assert "mixtral-8x7b" not in dense and "llama-3.1-8b" in dense
    lines = {line.split()[0]: line.split() for line in moe.splitlines() if line.strip()}
    assert lines["qwen3-30b-a3b"] == ["qwen3-30b-a3b", "30.5B", "3.35B", "48", "2048",
                                      "128x768", "8", "-", "4096"]
    assert lines["deepseek-v3"][5:8] == ["256x2048", "8+1", "3x18432"]
