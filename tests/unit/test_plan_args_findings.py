"""`estimate --plan` on a hand-written plan (user test 36, findings 5, 12 and 13): a typo inside
`cluster:` is named as an unknown key (it read as a missing profile), a GPU count that moves the
plan's dp says so in one line, and a misspelt model is named as written, not as a path."""

from __future__ import annotations

import json
import logging

import pytest

from autoplan.commands import main
from autoplan.model_spec import PRESETS
from autoplan.plan_files import plan_file_paths
from autoplan.yaml_io import dump_yaml, to_dict
from tests.cli_refusals import assert_refused

PLAN = ("schema_version: 1\nmodel: {model}\ncluster: {{{cluster}, num_gpus: 16}}\n"
        "parallel: {{dp: 4, tp: 2, pp: 2, cp: 1}}\nsequence_parallel: true\nzero_stage: 1\n"
        "batch: {{micro_batch_size: 1, global_batch_size: 256}}\nprecision: bf16\n")


def _plan(tmp_path, model: str = "llama-3.1-8b", cluster: str = "profile: h100-sxm-80gb"):
    path = tmp_path / "p.yaml"
    path.write_text(PLAN.format(model=model, cluster=cluster))
    return str(path)


@pytest.mark.parametrize("flags", [[], ["--cluster", "h100-sxm-80gb"]])
def test_a_typo_inside_cluster_is_an_unknown_key_with_or_without_cluster(tmp_path, capsys,
                                                                         flags) -> None:
    plan = _plan(tmp_path, cluster="profle: h100-sxm-80gb")
    assert_refused(capsys, ["estimate", "--plan", plan, *flags],
                   "cluster.profle: unknown key; did you mean 'profile'? valid keys: profile, "
                   "num_gpus")


def test_a_typo_in_a_cluster_set_is_an_unknown_key(capsys) -> None:
    assert_refused(capsys, ["estimate", "--model", "tiny", "--num-gpus", "2", "--set",
                            "cluster.profle=cpu-gloo"], "cluster.profle: unknown key")


def test_a_missing_profile_still_asks_for_cluster(tmp_path, capsys) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(PLAN.format(model="tiny", cluster="profile: cpu-gloo").replace(
        "profile: cpu-gloo, ", ""))
    assert_refused(capsys, ["estimate", "--plan", str(plan)], "--cluster: missing")


@pytest.mark.parametrize("flags", [["--num-gpus", "8"], ["--set", "cluster.num_gpus=8"]])
def test_a_gpu_count_that_moves_the_plans_dp_says_so(tmp_path, capsys, caplog, flags) -> None:
    with caplog.at_level(logging.WARNING, logger="autoplan.plan_args"):
        assert main(["estimate", "--plan", _plan(tmp_path), *flags, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["parallel"]["dp"] == 2
    assert [r.getMessage() for r in caplog.records] == [
        "dp 4 -> 2: the plan's dp, refitted to num_gpus 8 at tp 2 x pp 2 x cp 1"]


@pytest.mark.parametrize("flags", [["--num-gpus", "16"], ["--set", "zero_stage=2"],
                                   ["--num-gpus", "8", "--set", "parallel.dp=2"]])
def test_a_dp_that_stays_or_is_given_says_nothing(tmp_path, capsys, caplog, flags) -> None:
    with caplog.at_level(logging.WARNING, logger="autoplan.plan_args"):
        assert main(["estimate", "--plan", _plan(tmp_path), *flags, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["parallel"]["dp"] in (2, 4)
    assert caplog.records == []


def test_a_misspelt_model_is_named_as_written(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    err = assert_refused(capsys, ["estimate", "--plan", _plan(tmp_path, model="llama-3.1-8bb")],
                         "model: unknown model 'llama-3.1-8bb'; did you mean 'llama-3.1-8b'?")
    assert str(tmp_path) not in err


def test_a_dotted_bare_word_is_a_file_only_where_the_plans_folder_holds_it(tmp_path) -> None:
    """`llama-3.1-8bb` has no suffix but dots: a name unless the folder holds such a file."""
    for model in ("llama-3.1-8bb", "Meta-Llama-3.1-8B"):
        got = plan_file_paths({"model": model}, tmp_path / "p.yaml")
        assert got["model"] == model
    (tmp_path / "Meta-Llama-3.1-8B").mkdir()
    assert plan_file_paths({"model": "Meta-Llama-3.1-8B"}, tmp_path / "p.yaml")["model"] == \
        str(tmp_path / "Meta-Llama-3.1-8B")
    # a model file's suffix makes a path, found or not (the error names where it looked)
    assert plan_file_paths({"model": "m.yaml"}, tmp_path / "p.yaml")["model"] == \
        str(tmp_path / "m.yaml")


def test_a_dotted_model_file_beside_the_plan_is_read_from_any_folder(tmp_path, monkeypatch,
                                                                     capsys) -> None:
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "my-3.1").write_text(dump_yaml(to_dict(PRESETS["tiny"].replace(name="mine"))))
    plan = plans / "p.yaml"
    plan.write_text(PLAN.format(model="my-3.1", cluster="profile: cpu-gloo")
                    .replace("num_gpus: 16", "num_gpus: 4").replace("dp: 4, tp: 2, pp: 2",
                                                                     "dp: 4, tp: 1, pp: 1")
                    .replace("sequence_parallel: true", "sequence_parallel: false")
                    .replace("global_batch_size: 256", "global_batch_size: 4")
                    .replace("precision: bf16", "precision: fp32"))
    monkeypatch.chdir(tmp_path)
    code = main(["estimate", "--plan", "plans/p.yaml", "--format", "json"])
    assert json.loads(capsys.readouterr().out)["model"] == "mine" and code in (0, 3)
