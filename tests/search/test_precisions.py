"""A precision list no GPU type of --cluster runs is refused before any candidate is scored,
exit 2 (user test 36, finding 7: --precision bf16,fp8 on V100s scored 1,977,696 candidates and
exited 3)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.plan import Precision
from autoplan.search import cli as search_cli
from autoplan.search.precisions import check_runnable
from autoplan.search_space import load_space

V100 = ["search", "--model", "gpt3-1.3b", "--cluster", "v100-sxm2-32gb", "--num-gpus", "8",
        "--global-batch-size", "64"]


@pytest.fixture
def no_search(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the search ran")

    monkeypatch.setattr(search_cli, "run_search", refuse)


def test_precision_flag_the_gpu_lacks_is_refused_up_front(no_search, capsys) -> None:
    assert main([*V100, "--precision", "bf16,fp8"]) == 2
    err = capsys.readouterr().err
    assert err == ("autoplan search: error: --precision: got 'bf16,fp8', which V100-SXM2-32GB "
                   "(v100-sxm2-32gb) does not run: it runs fp16, fp32; give --precision fp16, "
                   "or auto (each GPU's own format)\n")


def test_a_space_file_whose_precision_the_gpu_lacks_is_refused(no_search, tmp_path,
                                                               capsys) -> None:
    space = tmp_path / "mine.yaml"
    space.write_text(yaml.safe_dump({"schema_version": 1, "name": "mine",
                                     "precision": ["bf16", "fp8"]}), encoding="utf-8")
    assert main([*V100, "--space", str(space)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("autoplan search: error: --space: ")
    assert "lists precision [bf16, fp8], which V100-SXM2-32GB" in err
    assert err.endswith("list fp16 in its precision, or give --precision fp16, or auto (each "
                        "GPU's own format)")


@pytest.mark.parametrize("sampler", ["exhaustive", "tpe"])
def test_the_shipped_bf16_only_test_space_on_a_v100_exits_2_for_every_sampler(
        sampler, no_search, capsys) -> None:
    space = str(Path(__file__).with_name("bf16-space.yaml"))
    trials = [] if sampler == "exhaustive" else ["--trials", "8"]
    argv = [*V100[:2], "gpt3-13b", *V100[3:], "--space", space, "--sampler", sampler, *trials]
    assert main(argv) == 2
    assert "lists precision [bf16], which V100-SXM2-32GB" in capsys.readouterr().err


def test_one_type_that_runs_a_listed_format_is_enough() -> None:
    space = load_space("default")
    types = [(n, load_profile(n)) for n in ("v100-sxm2-32gb", "a100-sxm4-80gb")]
    check_runnable(dataclasses.replace(space, precision=(Precision.BF16,)), types, "bf16",
                   "default")
    check_runnable(dataclasses.replace(space, precision=()), types[:1], "auto", "default")
    with pytest.raises(ConfigError) as err:
        check_runnable(dataclasses.replace(space, precision=(Precision.FP8,)), types, "fp8",
                       "default")
    assert str(err.value) == (  # fp16: every type runs it
        "--precision: got 'fp8', which no GPU type of --cluster runs (v100-sxm2-32gb runs fp16, "
        "fp32; a100-sxm4-80gb runs bf16, fp16, fp32); give --precision fp16")
