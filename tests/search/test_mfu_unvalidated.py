"""Search marks a plan whose predicted MFU lies above what the validated runs of its kind on its
GPU were predicted at (error_band.mfu_ceiling): "MFU?" in the table, an "unvalidated:" note
under it for the first plan (table and --report), and `mfu_ceiling` / `above_validated` in the
JSON rows. The ranking itself is the cost model's, uncapped."""

from __future__ import annotations

import html
import json
import math

import optuna
import pytest

from autoplan.commands import main
from autoplan.cost.error_band import KINDS, MIN_RUNS, mfu_ceiling
from autoplan.hardware import load_profile
from autoplan.search.rows import above_validated, mfu_cell

GPT3 = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
        "--runtime", "megatron", "--global-batch-size", "1536"]


def test_mfu_cell_marks_only_rows_frame_marks() -> None:
    assert mfu_cell({"mfu": 0.643, "mfu_ceiling": 0.581, "above_validated": True}) == "64.3%?"
    assert mfu_cell({"mfu": 0.55, "mfu_ceiling": 0.581, "above_validated": False}) == "55.0%"
    assert mfu_cell({"mfu": 0.9, "mfu_ceiling": math.nan}) == "90.0%"  # no validated range
    assert not above_validated({"mfu": 0.9})


def test_gpt3_search_flags_its_winner_and_keeps_its_ranking(capsys) -> None:
    assert main([*GPT3, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    top = data["top"]
    best = top[0]
    assert best["above_validated"] is True
    assert best["mfu"] > best["mfu_ceiling"] > 0.5  # megatron's A100 pipeline runs: ~58%
    # the order is by throughput, flagged or not (nothing caps a row)
    tokens = [r["tokens_per_s"] for r in top]
    assert tokens == sorted(tokens, reverse=True)
    assert main([*GPT3, "--format", "table"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"{best['mfu']:.1%}?" in text
    assert "MFU? = above the MFU predicted for every validated run of the plan's kind" in text
    ceiling = mfu_ceiling("megatron", KINDS.index("3d"), load_profile("a100-sxm4-80gb"),
                          "bf16", 2048)
    assert ceiling is not None and ceiling.family == "megatron" and ceiling.runs >= MIN_RUNS
    assert (f"unvalidated: the winner's MFU {best['mfu']:.1%} is above the {ceiling.runs} "
            f"validated megatron runs of pipeline layouts on A100") in text


def test_a_cost_ranking_report_notes_plan_1_apart_from_why(tmp_path, capsys) -> None:
    """Under two objectives there is no "why this plan" (gains in tokens/s explain one
    objective); the note on plan #1 stands under its own heading."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "r"
    assert main([*GPT3, "--objective", "throughput,cost", "--report", str(out),
                 "--format", "table"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "unvalidated: plan #1's MFU" in text
    page = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    assert "<h2>Why this plan</h2>" not in page
    notes = page.split("<h2>Notes on plan #1</h2>", 1)[1].split("<h2>", 1)[0]
    assert "unvalidated: plan #1's MFU" in notes


def test_a_stored_study_derives_its_ceilings_when_read(tmp_path, capsys) -> None:
    """Records hold no ceiling (a study stored before ceilings existed, or before the bands
    changed, shows the current ones), so they hold no NaN either."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    argv = [*GPT3, "--sampler", "tpe", "--trials", "12", "--seed", "1", "--storage", db,
            "--study", "g", "--format", "json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(isinstance(r["mfu_ceiling"], float) for r in data["top"])
    study = optuna.load_study(study_name="g", storage=db)
    records = [t.user_attrs["record"] for t in study.trials if "record" in t.user_attrs]
    assert records and all("mfu_ceiling" not in r for r in records)


def test_a_cpu_search_has_no_ceiling_to_hold_rows_against(capsys) -> None:
    argv = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
            "--global-batch-size", "8", "--space", "small-cpu"]
    assert main([*argv, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(r["mfu_ceiling"] is None and r["above_validated"] is False
               for r in data["top"])  # NaN written as null
    assert main([*argv, "--format", "table"]) == 0
    out = capsys.readouterr().out
    assert "unvalidated" not in out and "MFU?" not in out


def test_a_resumed_study_ranks_under_todays_bands(tmp_path, capsys, monkeypatch) -> None:
    """Records store the band they were scored with; a study resumed after error_bands.yaml
    changed ranked rows under two sets of bands (review of 69a97a3): collect derives every
    row's band from today's file."""
    from autoplan.cost import error_band

    db = f"sqlite:///{tmp_path / 's.db'}"
    argv = [*GPT3, "--sampler", "tpe", "--seed", "2", "--storage", db, "--study", "b",
            "--format", "json"]
    assert main([*argv, "--trials", "6"]) == 0
    first = json.loads(capsys.readouterr().out)["top"][0]["error_band"]
    bands = error_band._bands()
    changed = {**bands, "groups": [{**g, "band": 0.77} for g in bands["groups"]],
               "families": {k: {**v, "band": 0.77} for k, v in bands["families"].items()}}
    monkeypatch.setattr(error_band, "_bands", lambda: changed)
    assert main([*argv, "--trials", "12"]) == 0
    rows = json.loads(capsys.readouterr().out)["top"]
    assert first != 0.77 and {r["error_band"] for r in rows} == {0.77}
