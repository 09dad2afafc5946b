"""benchmarks/residuals.py: the candidates it regresses the cost model's misses on are what their
names say, and its least-squares fits find a cost that is planted in the residuals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.benchmark_scripts import load_script

pr = load_script("practitioner")
rs = load_script("residuals")


def _mpt(entry_id: str) -> dict:
    entries = pr.load_data(rs.DATA / "mpt-llm-foundry.yaml")
    return next(e for e in entries if e["id"] == entry_id)


def test_the_candidates_count_the_plans_micro_batches_blocks_and_tokens() -> None:
    # 2,048 sequences of 512 tokens on 8 data-parallel GPUs in micro-batches of 128
    f = rs.features(_mpt("mpt-125m-a100-8gpu-s512-m128"), predicted_s=1.0)
    assert f["microbatches"] == 2.0
    assert f["block_passes"] == 2.0 * 12  # 12 blocks, no pipeline
    assert f["tokens"] == 2048 * 512 / 8


def test_the_attention_candidate_is_the_attention_share_of_the_predicted_step() -> None:
    short = rs.features(_mpt("mpt-125m-a100-8gpu-s512-m128"), predicted_s=1.0)["attention"]
    long = rs.features(_mpt("mpt-125m-a100-8gpu-s65536-m1"), predicted_s=1.0)["attention"]
    assert 0.0 < short < 0.1 < 0.8 < long < 1.0  # 125M: 4sh against 24h^2 + logits per token
    scaled = rs.features(_mpt("mpt-125m-a100-8gpu-s65536-m1"), predicted_s=3.0)["attention"]
    assert scaled == pytest.approx(3.0 * long)


def test_fit_recovers_planted_slopes_and_says_what_is_left_unexplained() -> None:
    rng = np.random.default_rng(0)
    x1, x2 = rng.uniform(1, 10, 40), rng.uniform(0, 5, 40)
    coef, r2 = rs.fit(0.2 + 3.0 * x1 - 2.0 * x2, x1, x2)
    assert coef == pytest.approx([0.2, 3.0, -2.0]) and r2 == pytest.approx(1.0)
    # a candidate that does not vary explains nothing
    coef, r2 = rs.fit(x1, np.full(40, 7.0))
    assert coef[1] == 0.0 and r2 == 0.0
    # noise around a slope: the slope is found and R^2 says how much noise there is
    y = 0.5 * x1 + rng.normal(0, 0.5, 40)
    coef, r2 = rs.fit(y, x1)
    assert coef[1] == pytest.approx(0.5, abs=0.1) and 0.6 < r2 < 1.0


def test_explain_names_the_candidate_a_planted_per_micro_batch_cost_follows() -> None:
    rng = np.random.default_rng(1)
    n = 12
    table = pd.DataFrame({
        "source": "s", "profile": "p", "runtime": "r", "recompute": False,
        "microbatches": rng.integers(1, 30, n).astype(float),
        "block_passes": rng.uniform(10, 500, n), "tokens": rng.uniform(1e4, 1e6, n),
        "predicted": rng.uniform(1, 50, n), "attention": rng.uniform(0, 5, n)})
    table["residual"] = 0.120 * table.microbatches  # 120 ms per micro-batch, nothing else
    table["measured"] = table.predicted + table.residual
    found = rs.explain(table, min_rows=6)
    row = found.iloc[0]
    assert row.best == "microbatches"
    assert row.microbatches_slope == pytest.approx(0.120) and row.microbatches_r2 == pytest.approx(1)
    assert "microbatches" in row.pair and row.pair_r2 == pytest.approx(1.0)
    assert rs.explain(table, min_rows=n + 1).empty  # too few rows: the group is left out
    small = rs.explain(table.iloc[:4], min_rows=3).iloc[0]  # 4 rows: singles, but no pair
    assert small.best == "microbatches" and small.pair is None


def test_too_few_rows_per_group_is_refused_with_the_fix(capsys) -> None:
    assert rs.main(["--min-rows", "2"]) == 2
    err = capsys.readouterr().err
    assert "--min-rows 2" in err and "3 or more" in err and "\n" == err[-1] and err.count("\n") == 1
