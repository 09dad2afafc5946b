"""benchmarks/published_accuracy.py's method on planted rows: ranking groups compare time per
token and pick only runs predicted to fit, and the leave-one-source-out table says which band
each source was tested against."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_script

bench = load_script("published_accuracy")


def _row(run_id: str, tokens: int, measured: float, predicted: float, feasible: bool = True,
         group: str = "m on 8 x gpu", source: str = "s", error: float = 0.0) -> dict:
    return {"id": run_id, "group": group, "tokens": tokens, "measured_s": measured,
            "predicted_s": predicted, "feasible": feasible, "source": source, "error": error,
            "runtime": "megatron", "kind": "3d", "scale": "cluster"}


def test_a_group_is_ranked_per_token_among_the_runs_predicted_to_fit() -> None:
    rows = [
        _row("small-batch", 1000, measured=1.0, predicted=0.9),  # 1.0 ms per token measured
        _row("large-batch", 2000, measured=1.6, predicted=1.7),  # 0.8 ms: fastest per token
        _row("does-not-fit", 1000, measured=1.2, predicted=0.5, feasible=False),
        _row("x", 1000, measured=1.0, predicted=1.0, feasible=False, group="none fits"),
        _row("y", 1000, measured=2.0, predicted=0.5, feasible=False, group="none fits"),
    ]
    picks = {g["group"]: g for g in bench.first_choice(rows)}
    g = picks["m on 8 x gpu"]
    assert (g["picked"], g["fastest"]) == ("large-batch", "large-batch")
    assert g["regret"] == pytest.approx(0.0) and g["feasible"] == 2
    # priced slower per token than it ran, the large batch is passed over: 1.0 / 0.8 - 1
    rows[1]["predicted_s"] = 2.0
    g = {g["group"]: g for g in bench.first_choice(rows)}["m on 8 x gpu"]
    assert g["picked"] == "small-batch" and g["regret"] == pytest.approx(0.25)
    none = picks["none fits"]
    assert none["picked"] is None and none["regret"] is None and none["fastest"] == "x"


def test_each_source_is_tested_against_a_named_band_or_the_default() -> None:
    errors = (0.05, -0.05, 0.05)
    rows = ([_row(f"a{i}", 1, 1, 1, source="A", error=e) for i, e in enumerate(errors)]
            + [_row(f"b{i}", 1, 1, 1, source="B", error=2 * e) for i, e in enumerate(errors)]
            + [{**_row("c", 1, 1, 1, source="C", error=0.2), "runtime": "llm-foundry",
                "kind": "dp"}])
    loso = bench.leave_one_source_out(rows)
    (a,) = loso["A"]["bands"]  # A against B's three runs: B's band, named
    assert a["band"] == pytest.approx(bench.band_of([0.1, -0.1, 0.1]))
    assert a["origin"] == "megatron 3d cluster: 3 runs from 1 source" and a["inside"] == 3
    (c,) = loso["C"]["bands"]  # no other llm-foundry run: the default
    assert c["origin"] is None and c["band"] == 0.25 and c["inside"] == 1
    assert bench.coverage(loso) == {"residual": [6, 6], "default": [1, 1]}


def test_a_group_reports_how_well_the_model_orders_its_runs() -> None:
    """Spearman's rho of predicted against measured time per token: 1 when the order is kept
    (whatever the scale), -1 when reversed; none for a group of two."""
    rows = [_row(f"r{i}", 1000, measured=m, predicted=m / 2)
            for i, m in enumerate((1.0, 2.0, 3.0, 4.0))]
    assert bench.first_choice(rows)[0]["spearman"] == pytest.approx(1.0)
    for r, p in zip(rows, (4.0, 3.0, 2.0, 1.0), strict=True):
        r["predicted_s"] = p
    g = bench.first_choice(rows)[0]
    assert g["spearman"] == pytest.approx(-1.0) and g["picked"] == "r3"
    assert g["regret"] == pytest.approx(3.0)
    assert bench.first_choice(rows[:2])[0]["spearman"] is None
