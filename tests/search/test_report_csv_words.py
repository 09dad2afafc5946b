"""What report.html and trials.csv.gz say about themselves (user test 36, findings 15 and 16):
rejected plans name their precision wherever the search had several, the Pareto plot says when
it draws a sample, and trials.csv.gz spells a plan's null dp_shard and grad_reduce in words."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from autoplan.search.engine import run_search
from autoplan.search.output import csv_words
from autoplan.search.ranking import frame
from autoplan.search.report import rejected_words
from autoplan.search.report_plots import feasible_label
from autoplan.search.targets import Targets
from tests.search.conftest import SMALL_SPACE, request

SPACE = {**copy.deepcopy(SMALL_SPACE), "attention": ["flash"]}


def _missed(precision: list[str]):
    """An H100 search where every plan misses an impossible step time."""
    req = request({**SPACE, "precision": precision}, cluster="h100-sxm-80gb", gpus=(8,),
                  gbs=16, targets=Targets(max_step_time_s=1e-9))
    result = run_search(req)
    assert not result.scored.feasible.any() and result.scored.n
    return result


def test_rejected_rows_of_one_precision_still_name_it_when_several_were_searched() -> None:
    result = _missed(["bf16", "fp8"])
    c = result.scored.cols
    fp8 = np.flatnonzero(c["precision"] == 1)[:8]  # rows that share one precision
    assert len(fp8) >= 2
    assert all(w.endswith("precision=fp8") or " precision=fp8" in w
               for w in rejected_words(result, fp8))
    one = _missed(["bf16"])
    assert not any("precision=" in w for w in rejected_words(one, np.arange(min(8, one.scored.n))))


def test_the_pareto_legend_says_when_it_draws_a_sample() -> None:
    assert feasible_label(20_081, 167_324) == "feasible plans: a sample of 20,081 of 167,324"
    assert feasible_label(412, 412) == "feasible plans (412)"


def test_trials_csv_spells_a_plans_null_in_words() -> None:
    space = copy.deepcopy(SMALL_SPACE)
    space["parallel"] = {"dp": None, "tp": [1, 2], "pp": [1], "cp": [1], "dp_shard": [None, 2]}
    space["zero_stage"] = [3]
    space["grad_reduce_dtype"] = [None, "bf16"]
    space["precision"] = "bf16"
    req = request(space, cluster="a100-sxm4-80gb", gpus=(16,), gbs=32)
    result = run_search(req)
    df = csv_words(frame(result.scored, result.order, req.space, req.targets))
    assert set(df["dp_shard"].astype(str)) == {"off", "2"}
    assert set(df["grad_reduce"]) == {"default", "bf16"}
    import io

    back = pd.read_csv(io.StringIO(df.to_csv()))  # as pandas.read_csv reads the file
    assert not back[["dp_shard", "grad_reduce"]].isna().any().any()
    # report.html's rejected rows say the same words as the CSV (review A S4)
    words = " ".join(rejected_words(result, result.order[:40]))
    assert "dp_shard=off" in words and "grad_reduce=default" in words
    assert "dp_shard=0" not in words and "grad_reduce= " not in words + " "
