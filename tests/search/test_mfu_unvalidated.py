"""Search marks a plan whose predicted MFU lies above every validated run of its kind on its GPU
(error_band.mfu_ceiling): "MFU?" in the table, an "unvalidated:" line under it for the winner,
and `mfu_ceiling` in the JSON rows. The ranking itself is the cost model's, uncapped."""

from __future__ import annotations

import json
import math

from autoplan.commands import main
from autoplan.search.render import above_validated, mfu_cell

GPT3 = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
        "--runtime", "megatron", "--global-batch-size", "1536"]


def test_mfu_cell_marks_only_rows_above_a_ceiling() -> None:
    assert mfu_cell({"mfu": 0.643, "mfu_ceiling": 0.5627}) == "64.3%?"
    assert mfu_cell({"mfu": 0.55, "mfu_ceiling": 0.5627}) == "55.0%"
    assert mfu_cell({"mfu": 0.9, "mfu_ceiling": math.nan}) == "90.0%"  # no validated range
    assert not above_validated({"mfu": 0.9})


def test_gpt3_search_flags_its_winner_and_keeps_its_ranking(capsys) -> None:
    assert main([*GPT3, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    top = data["top"]
    best = top[0]
    assert best["mfu"] > best["mfu_ceiling"] > 0.5  # megatron's A100 pipeline runs: ~56%
    # the order is by throughput, flagged or not (nothing caps a row)
    tokens = [r["tokens_per_s"] for r in top]
    assert tokens == sorted(tokens, reverse=True)
    assert main([*GPT3, "--format", "table"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"{best['mfu']:.1%}?" in text
    assert "MFU? = above every validated run of the plan's kind on its GPU" in text
    assert (f"unvalidated: the winner's MFU {best['mfu']:.1%} is above all validated megatron "
            f"runs of pipeline layouts on A100") in text


def test_a_cpu_search_has_no_ceiling_to_hold_rows_against(capsys) -> None:
    argv = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
            "--global-batch-size", "8", "--space", "small-cpu"]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(r["mfu_ceiling"] is None for r in data["top"])  # NaN written as null
    assert main([*argv, "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "unvalidated" not in out and "MFU?" not in out
