"""`tune --format yaml` rounds its figures for reading (4 significant figures) as search and
estimate do; `--format json` keeps every digit; the dry run and the tune alike."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main

TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2", "--top", "1", "--steps", "3"]
FAKE_TRAIN = ("import json, sys\n"
              "with open(sys.argv[1], 'w') as fh:\n"
              "    for step in range(int(sys.argv[2])):\n"
              "        fh.write(json.dumps({'step': step, 'step_time_s': 0.0123456789}) + '\\n')\n")


def _four_figures(value: float) -> bool:
    return value == float(f"{value:.4g}")


@pytest.mark.parametrize("dry", [True, False], ids=["dry run", "tune"])
def test_yaml_is_rounded_and_json_is_not(capsys, monkeypatch, tmp_path: Path, dry: bool) -> None:
    def fake(plan_path: Path, nproc: int, steps: int, metrics: Path) -> list[str]:
        return [sys.executable, "-c", FAKE_TRAIN, str(metrics), str(steps)]

    monkeypatch.setattr("autoplan.tune.runner.train_command", fake)
    monkeypatch.chdir(tmp_path)
    argv = TUNE + (["--dry-run"] if dry else [])
    assert main([*argv, "--format", "json"]) == 0
    full = json.loads(capsys.readouterr().out)["trials"][0]
    assert main([*argv, "--format", "yaml"]) == 0
    short = yaml.safe_load(capsys.readouterr().out)["trials"][0]
    assert not _four_figures(full["predicted_step_s"])
    assert short["predicted_step_s"] == float(f"{full['predicted_step_s']:.4g}")
    if not dry:
        assert _four_figures(short["measured_tokens_per_s"])
