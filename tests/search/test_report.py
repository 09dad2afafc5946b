"""`--report` (issue #16 item 6): one self-contained HTML page with the inputs, the ranked table,
the Pareto front, memory and time per plan under distinct labels, and what was rejected."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest

from autoplan.search.engine import run_search
from autoplan.search.report import shown_plans, write_report
from autoplan.search.report_plots import DP1_LABEL, plan_labels, small_series

from .conftest import SMALL_SPACE, request

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def result():
    return run_search(request("default", model="tiny", cluster="cpu-gloo", gpus=(4,), gbs=16))


def test_one_self_contained_page_with_every_section(result, tmp_path) -> None:
    path = write_report(result, tmp_path / "r", 10, force=False)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["report.html"]
    page = path.read_text(encoding="utf-8")
    for section in ("Inputs", "Why this plan", "Ranked plans", "Pareto front", "Memory per GPU",
                    "Where the step time goes", "Rejected candidates"):
        assert f"<h2>{section}</h2>" in page, section
    sources = re.findall(r"src='([^']*)'", page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http://" not in page and "https://" not in page and "<link" not in page
    assert "tiny" in page and "cpu-gloo" in page and "global batch" in page
    assert page.count("<tr") > 10  # the ranked plans and the outcomes by reason
    with pytest.raises(Exception, match="already exists|already holds"):
        write_report(result, tmp_path / "r", 10, force=False)


def test_bars_carry_distinct_labels_beyond_the_degrees(result) -> None:
    shown, rows = shown_plans(result, 10)
    labels = plan_labels(result, rows, [s.rank for s in shown])
    assert len(set(labels)) == len(labels) == len(rows)
    c = result.scored.cols
    degrees = {(c["dp"][i], c["tp"][i], c["pp"][i], c["cp"][i]) for i in rows}
    assert len(degrees) < len(rows)  # plain degrees would repeat, the labels do not
    assert all(label.startswith(f"#{s.rank} ") for label, s in zip(labels, shown, strict=True))


def test_without_data_parallelism_no_gradient_sync_is_billed(result) -> None:
    _, rows = shown_plans(result, 10)
    c = result.scored.cols
    dp1 = c["dp"][rows] == 1
    assert dp1.any() and (~dp1).any()
    series = dict(small_series(result, rows))
    assert np.all(series["data-parallel gradient sync"][dp1] == 0)
    assert np.allclose(series[DP1_LABEL][dp1], c["time_dp_comm"][rows][dp1])
    assert np.all(series[DP1_LABEL][~dp1] == 0)


def test_out_compresses_trials_and_says_what_it_wrote(tmp_path, capsys) -> None:
    import gzip

    import pandas as pd

    from autoplan.commands import main

    out = tmp_path / "res"
    code = main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                 "--global-batch-size", "16", "--format", "json", "--out", str(out),
                 "--report", str(tmp_path / "rep")])
    err = capsys.readouterr().err
    assert code == 0
    for path in (out / "plan.yaml", out / "trials.csv.gz", out / "summary.json",
                 tmp_path / "rep" / "report.html"):
        assert f"wrote {path}" in err
    with gzip.open(out / "trials.csv.gz", "rt") as fh:
        assert fh.readline().startswith("row,num_gpus,dp,tp")
    trials = pd.read_csv(out / "trials.csv.gz")
    assert len(trials) > 100 and (trials["status"] == "feasible").any()


def test_rejected_plans_name_the_knobs_they_differ_in() -> None:
    """Eight rejected rows of one layout read alike (`dp16 tp1 ... mbs8` eight times, user test
    35): each now names the knobs the rows shown differ in, and two rows never read the same
    unless they are the same plan."""
    from autoplan.search.ranking import frame
    from autoplan.search.report import REJECTED_ALWAYS, rejected_words

    result = run_search(request("default", model="gpt3-350m", cluster="cpu-gloo", gpus=(4,),
                                gbs=16))  # most of its candidates miss the CPU's memory
    c = result.scored.cols
    missed = np.flatnonzero(~result.scored.feasible)
    assert len(missed) >= 8
    rows = missed[np.argsort(-c["tokens_per_s"][missed], kind="stable")][:8]
    words = rejected_words(result, rows)
    df = frame(result.scored, rows, result.request.space, result.request.targets)
    knobs = [k for k in ("dp", "tp", "pp", "cp", "vpp", "zero", "mbs", "sp", "schedule",
                         "recompute", "recompute_layers", "offload_optimizer", "precision",
                         "attention") if k in df]
    distinct = df[knobs].astype(str).drop_duplicates()
    assert len(set(words)) == len(distinct)
    assert all(w.split()[:len(REJECTED_ALWAYS)] == [f"{k}{df.iloc[j][k]}"
                                                    for k in REJECTED_ALWAYS]
               for j, w in enumerate(words))


def _sampler_row(result, path) -> str:
    page = write_report(result, path, 5, force=False).read_text(encoding="utf-8")
    found = re.findall(r"<td class='l'>sampler</td><td class='l'>([^<]*)</td>", page)
    assert len(found) == 1, page[:2000]
    return html.unescape(found[0])


def test_the_sampler_row_gives_the_space_a_sampled_search_drew_from(result, tmp_path) -> None:
    """The terminal header says a sampled search's space size against max_enumerate
    (sampled.sampled_text, JSON sampled_space); the report's sampler row said only the
    sampler, its seed and its trials."""
    fell_back = run_search(request({**SMALL_SPACE, "max_enumerate": 100}, trials=12))
    size = fell_back.request.space_size()
    assert fell_back.sampler == "tpe" and size > 100
    assert _sampler_row(fell_back, tmp_path / "tpe") == (
        f"tpe (seed 0, 12 trials; the space's {size:,} candidates exceed max_enumerate 100)")
    given = run_search(request(SMALL_SPACE, trials=12, sampler="random"))
    assert _sampler_row(given, tmp_path / "random") == (
        f"random (seed 0, 12 trials of the space's {size:,} candidates)")
    assert _sampler_row(result, tmp_path / "exhaustive") == "exhaustive (seed 0)"
