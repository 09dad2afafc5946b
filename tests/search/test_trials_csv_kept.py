"""trials.csv.gz holds the rows that can matter by default, every scored row with --all-trials
(user test 35: a one-count Qwen3-MoE search wrote 1.3M rows, 99.5 MB, doubling its time)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from autoplan.commands import main
from autoplan.search.engine import KEEP_PER_COUNT

JOB = ["search", "--model", "llama-3.1-8b", "--cluster", "h100-sxm-80gb", "--num-gpus", "8",
       "--global-batch-size", "64", "--precision", "bf16", "--format", "json"]


def test_the_default_csv_keeps_the_best_and_the_nearest_and_all_trials_keeps_every_row(
        tmp_path: Path, capsys) -> None:
    assert main([*JOB, "--out", str(tmp_path / "kept")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main([*JOB, "--out", str(tmp_path / "all"), "--all-trials"]) == 0
    capsys.readouterr()
    kept = pd.read_csv(tmp_path / "kept" / "trials.csv.gz")
    every = pd.read_csv(tmp_path / "all" / "trials.csv.gz")
    summary = json.loads((tmp_path / "kept" / "summary.json").read_text())
    assert len(every) == data["scored"] == json.loads(
        (tmp_path / "all" / "summary.json").read_text())["trials_csv_rows"]
    assert summary["trials_csv_rows"] == len(kept) < len(every) // 10
    # at most the best 2,000, the Pareto front (one objective: the best) and 2,000 misses
    assert len(kept) <= 2 * KEEP_PER_COUNT + 1
    feasible = kept[kept["status"] == "feasible"]
    assert len(feasible) == KEEP_PER_COUNT  # this search has more feasible plans than that
    # the same ranked head, row for row: the kept file is the full one's best and nearest
    head = ["dp", "tp", "pp", "cp", "zero", "mbs", "step_s"]
    assert kept[head].head(50).equals(every[head].head(50))
    assert kept.iloc[0]["step_s"] == data["top"][0]["step_s"]


def test_all_trials_without_out_is_one_line(capsys) -> None:
    assert main([*JOB, "--all-trials"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--all-trials: given without --out" in err


def test_a_top_above_the_kept_count_is_in_the_csv_too(tmp_path: Path, capsys,
                                                      monkeypatch) -> None:
    """--top 2500 listed 2,500 plans in top.yaml while trials.csv.gz held 2,000 feasible ones
    (review of 9ec92af): the file holds the --top ranked first as well."""
    from autoplan.search import engine

    monkeypatch.setattr(engine, "KEEP_PER_COUNT", 20)
    assert main([*JOB, "--top", "30", "--out", str(tmp_path / "r")]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = pd.read_csv(tmp_path / "r" / "trials.csv.gz")
    feasible = rows[rows["status"] == "feasible"]
    assert len(feasible) == 30 and len(data["top"]) == 30
    assert list(feasible["step_s"]) == [r["step_s"] for r in data["top"]]
