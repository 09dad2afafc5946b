"""The Pareto table (several objectives) shows each plan's error band beside its step time, as
the single-objective table does, and the JSON's `top` rows carry it (`error_band`) either way:
the same figure as the plan's predicted.error_band."""

from __future__ import annotations

import json
import re

import pytest

from autoplan.commands import main

SEARCH = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1..8",
          "--global-batch-size", "16", "--space", "small-cpu"]


@pytest.mark.parametrize("objective", ["throughput", "throughput,gpus"])
def test_every_row_shows_its_band_in_the_table_and_the_json(capsys, monkeypatch,
                                                            objective: str) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    assert main([*SEARCH, "--objective", objective, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    bands = [r["error_band"] for r in data["top"]]
    assert bands and all(isinstance(b, float) and 0 < b < 1 for b in bands), bands
    assert bands[0] == pytest.approx(data["best"]["predicted"]["error_band"])
    assert main([*SEARCH, "--objective", objective, "--format", "table"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\s*\d+\s+\d+\s+\d+", line)]
    assert rows and all(f"±{bands[0]:.0%}" in line for line in rows), out
    assert "± = the cost model's error band" in " ".join(out.split())
