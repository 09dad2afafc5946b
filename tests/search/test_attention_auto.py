"""`attention: auto` (the shipped spaces): flash where the runtime runs a fused kernel on the
GPU, eager where it does not (Transformer Engine before Ampere, Megatron-LM before 2023), so a
search under such a runtime finds its plans instead of refusing every candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import Attention
from autoplan.search_space import load_space, space_from_dict

JOB = ["search", "--model", "gpt3-1.3b", "--num-gpus", "8", "--global-batch-size", "64",
       "--top", "3", "--format", "json"]


def _attention(capsys, cluster: str, runtime: str, *extra: str) -> set[str]:
    code = main([*JOB, "--cluster", cluster, "--runtime", runtime, *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return {r["attention"] for r in json.loads(out.out)["top"]}


@pytest.mark.parametrize(("cluster", "runtime", "kind"), [
    ("v100-sxm2-32gb", "megatron", "eager"),  # TE: no fused attention below sm80
    ("a100-sxm4-80gb", "megatron", "flash"),
    ("v100-sxm2-32gb", "autoplan", "flash"),  # SDPA's memory-efficient kernel runs there
    ("a100-sxm4-80gb", "megatron-2021", "eager"),  # no fused attention in 2021
])
def test_auto_settles_per_runtime_and_device(cluster: str, runtime: str, kind: str,
                                             capsys) -> None:
    assert _attention(capsys, cluster, runtime) == {kind}


def test_types_that_differ_search_both_and_each_keeps_what_it_runs(capsys) -> None:
    """A V100 beside an A100 under Megatron: the space holds both kernels, the V100's flash
    rows are refused by its runtime rule, and its best plan is the one it finds alone."""
    from autoplan.commands import build_parser
    from autoplan.search.cli import build_request

    both = ["--cluster", "v100-sxm2-32gb,a100-sxm4-80gb", "--runtime", "megatron",
            "--precision", "fp16"]
    assert build_request(build_parser().parse_args([*JOB, *both])).space.attention == (
        Attention.FLASH, Attention.EAGER)
    assert main([*JOB, *both]) == 0
    v100 = next(r for r in json.loads(capsys.readouterr().out)["by_cluster"]
                if r["which"] == "v100-sxm2-32gb")
    assert main([*JOB, "--cluster", "v100-sxm2-32gb", "--runtime", "megatron"]) == 0
    alone = json.loads(capsys.readouterr().out)["top"][0]
    assert v100["feasible"] and alone["attention"] == "eager"
    assert v100["step_s"] == pytest.approx(alone["step_s"], rel=1e-12)


def test_a_cheap_v100_wins_with_the_attention_it_was_priced_with(tmp_path, capsys) -> None:
    """Review of 1917bc8: each type settled `auto` on its own (V100 eager, A100 flash), both as
    code 0, and the merged table read code 0 as flash: the V100 winner's plan.yaml said flash
    (which estimate then refused) for a step priced as eager."""
    from autoplan.cost.estimate import estimate_plan
    from autoplan.plan_files import load_plan

    out = tmp_path / "mix"
    assert main(["search", "--model", "gpt3-1.3b", "--num-gpus", "8", "--global-batch-size",
                 "64", "--cluster", "a100-sxm4-80gb,v100-sxm2-32gb", "--runtime", "megatron",
                 "--precision", "fp16", "--objective", "cost", "--price",
                 "v100-sxm2-32gb=0.01", "--train-tokens", "1e9", "--format", "json",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    plan = load_plan(out / "plan.yaml")
    assert plan.cluster.profile == "v100-sxm2-32gb" and plan.attention == Attention.EAGER
    est = estimate_plan(plan.replace(predicted=None), runtime="megatron")
    assert est.feasible and est.step_time_s == pytest.approx(plan.predicted["step_time_s"],
                                                             rel=1e-9)


def test_auto_is_the_shipped_spaces_and_an_empty_list_is_refused() -> None:
    assert load_space("default").attention == ()
    assert space_from_dict({"schema_version": 1, "name": "s", "attention": "auto"}).attention == ()
    with pytest.raises(ConfigError) as err:
        space_from_dict({"schema_version": 1, "name": "s", "attention": []})
    assert str(err.value) == ("space: attention: got an empty list; list flash, eager or both, "
                              "or write auto")


@pytest.mark.parametrize(("cluster", "runtime", "kind"), [
    ("v100-sxm2-32gb", "megatron", "eager"), ("v100-sxm2-32gb", None, "flash"),
    ("a100-sxm4-80gb", "megatron", "flash"), ("a100-sxm4-80gb", "megatron-2021", "eager"),
])
def test_estimates_default_plan_takes_the_attention_the_runtime_runs(cluster, runtime, kind,
                                                                     capsys) -> None:
    """estimate without --plan settles attention as the search does: its default plan under
    Megatron on a V100 was refused for flash attention it could have left out."""
    argv = ["estimate", "--model", "gpt3-1.3b", "--cluster", cluster, "--num-gpus", "8",
            "--format", "json", *(["--runtime", runtime] if runtime else [])]
    main(argv)
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["attention"] == kind
    assert not [r for r in data["reasons"] if "attention" in r]


def test_the_nearest_miss_names_its_attention_so_estimate_prices_the_same_plan(
        tmp_path, capsys) -> None:
    """A space with `attention: flash` under megatron-2021 refuses every candidate; its nearest
    miss left attention out (flash is a plan's default), and estimate with those --set words
    then took megatron-2021's eager default: another plan, another reason (review of
    7ab3c85). The words now name attention, and estimate refuses what search refused."""
    import yaml

    space = yaml.safe_load(Path("search_spaces/default.yaml").read_text()) | {
        "name": "flash-only", "attention": "flash"}
    (tmp_path / "flash.yaml").write_text(yaml.safe_dump(space))
    job = ["--model", "gpt3-1.3b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "8",
           "--global-batch-size", "64", "--runtime", "megatron-2021"]
    assert main(["search", *job, "--space", str(tmp_path / "flash.yaml"),
                 "--format", "json"]) == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    sets = line.split("(as estimate --set) ")[1].split(": ")[0].split()
    assert "attention=flash" in sets
    main(["estimate", *job, "--set", *sets, "--format", "json"])
    reasons = json.loads(capsys.readouterr().out)["reasons"]
    assert any("computes attention unfused only" in r for r in reasons)


def test_a_study_stored_before_auto_says_how_to_resume_it() -> None:
    """A V100/Megatron study stored with `attention: flash` (before `auto`) met 'rerun that
    exact command', which the user had just done (review of 1917bc8): the fix now names the
    space line that resumes it."""
    from autoplan.search.optuna_search import _mismatch

    err = _mismatch("s1", ['space.attention ["flash"] -> ["eager"]'], auto_attention=True)
    assert err.fix == ('attention: auto now settles to what the runtime runs on the GPU; to '
                       'resume, give a space that lists the study\'s attention (["flash"]), or '
                       'use another --study name')
    plain = _mismatch("s1", ['space.attention ["flash"] -> ["eager"]'])
    assert plain.fix == "rerun that exact command, or use another --study name"
