"""User test 37, findings 10 and 12: an unknown profile says where autoplan looked and how to
make one; the dp refit of the README's `--set parallel.tp=2` on the default plan is an info
line, a plan file's dp refitted is still a warning."""

from __future__ import annotations

import json
import logging

import pytest

from autoplan.commands import main
from tests.cli_refusals import assert_refused

README = ["estimate", "--model", "llama-3-8b", "--cluster", "h100-sxm-80gb", "--num-gpus", "64",
          "--global-batch-size", "512", "--set", "parallel.tp=2", "--set", "zero_stage=1",
          "--format", "json"]


def test_an_unknown_profile_says_where_autoplan_looked_and_how_to_make_one(
        tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    assert_refused(capsys, ["search", "--model", "tiny", "--cluster", "my-machine", "--num-gpus",
                            "4", "--global-batch-size", "16"],
                   "--cluster: unknown profile 'my-machine'; choose one of",
                   f"looked in {tmp_path} ($AUTOPLAN_PROFILES sets another folder), then the "
                   "shipped ones", "`autoplan profile --name my-machine`")


def test_the_readme_tp_set_refits_dp_as_info_not_a_warning(capsys, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="autoplan.plan_args"):
        assert main(README) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["parallel"]["dp"] == 32
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("dp 64 -> 32: the plan's dp, refitted")


@pytest.mark.parametrize("flags", [["--num-gpus", "8"], ["--set", "parallel.tp=4"]])
def test_a_plan_files_dp_refitted_stays_a_warning(tmp_path, capsys, caplog, flags) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("schema_version: 1\nmodel: llama-3.1-8b\ncluster: {profile: h100-sxm-80gb, "
                    "num_gpus: 16}\nparallel: {dp: 4, tp: 2, pp: 2}\nzero_stage: 1\n"
                    "batch: {micro_batch_size: 1, global_batch_size: 256}\n")
    with caplog.at_level(logging.INFO, logger="autoplan.plan_args"):
        assert main(["estimate", "--plan", str(plan), *flags, "--format", "json"]) in (0, 3)
    capsys.readouterr()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
