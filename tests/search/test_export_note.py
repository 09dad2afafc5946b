"""search says when the export target of the runtime it priced for refuses its winner, and the
other targets stop sending a model megatron refuses to megatron (user test 34: gpt-oss-120b
searched under --runtime megatron could be exported nowhere, each refusal naming another)."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.export.base import ExportOptions
from autoplan.export.registry import get_target
from autoplan.model_spec import PRESETS
from autoplan.plan import plan_from_dict

GPT_OSS = ["search", "--model", "gpt-oss-120b", "--cluster", "h100-sxm-80gb", "--num-gpus", "64",
           "--global-batch-size", "512", "--runtime", "megatron", "--sampler", "tpe",
           "--trials", "40", "--seed", "3"]


def test_a_gpt_oss_search_under_megatron_says_megatron_cannot_write_it(capsys) -> None:
    assert main([*GPT_OSS, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["export"]["target"] == "megatron"
    assert any("rope_scaling yarn without multi-latent attention" in r
               for r in data["export"]["refused"])
    assert main([*GPT_OSS, "--format", "table"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "export: `autoplan export --to megatron` cannot write the winner: model.rope_scaling" \
        in text


def test_a_winner_megatron_writes_has_an_empty_refusal_and_no_line(capsys) -> None:
    argv = ["search", "--model", "gpt3-1.3b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "8",
            "--global-batch-size", "64", "--runtime", "megatron"]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["export"] == {"target": "megatron", "refused": []}
    assert main([*argv, "--format", "table"]) == 0
    assert "cannot write the winner" not in capsys.readouterr().out
    # autoplan's own runtime has no --to target of its own: `autoplan train` runs it
    assert main(argv[:-2] + ["--format", "json"]) == 0
    assert "export" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed"])
def test_other_targets_send_gpt_oss_nowhere_and_mixtral_to_megatron(target) -> None:
    def reasons(model: str) -> str:
        plan = plan_from_dict({"model": model,
                               "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
                               "parallel": {"dp": 16, "pp": 4, "ep": 8},
                               "batch": {"micro_batch_size": 1, "global_batch_size": 512}})
        return "; ".join(get_target(target).check(plan, PRESETS[model], ExportOptions()))

    oss = reasons("gpt-oss-120b")
    assert "export to megatron" not in oss
    assert "megatron refuses model gpt-oss-120b too (model.rope_scaling yarn without " \
           "multi-latent attention)" in oss
    assert "export to megatron" in reasons("mixtral-8x7b")
