"""`search --precision LIST`: the formats to search without writing a space YAML (user test
34, N16). It replaces the space's precision list; `auto` restores the device's own."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main

JOB = ["search", "--model", "llama-3.1-8b", "--num-gpus", "8", "--global-batch-size", "64",
       "--top", "5", "--format", "json"]


def _search(capsys, *extra: str, cluster: str = "h100-sxm-80gb") -> tuple[int, dict, str]:
    code = main([*JOB, "--cluster", cluster, *extra])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else {}), out.err


def test_precision_replaces_the_spaces_list_and_every_plan_keeps_to_it(capsys) -> None:
    code, auto, _ = _search(capsys)
    assert code == 0 and auto["precisions"] == ["bf16", "fp8"]  # an H100's own formats
    assert {r["precision"] for r in auto["top"]} == {"fp8"}  # fp8 wins when offered
    code, bf16, _ = _search(capsys, "--precision", "bf16")
    assert code == 0 and bf16["precisions"] == ["bf16"]
    assert {r["precision"] for r in bf16["top"]} == {"bf16"}
    assert bf16["scored"] < auto["scored"]  # half the formats, fewer candidates scored
    code, back, _ = _search(capsys, "--precision", "auto")
    assert code == 0 and back["precisions"] == auto["precisions"]


@pytest.mark.parametrize(("value", "words"), [
    ("bf8", "got 'bf8' in 'bf8'; list some of bf16, fp16, fp32, fp8"),
    ("bf16,bf16", "got 'bf16,bf16' with repeats"),
    ("bf16,", "got '' in 'bf16,'"),
])
def test_a_bad_precision_list_is_one_line_naming_the_flag(value: str, words: str,
                                                          capsys) -> None:
    code, _, err = _search(capsys, "--precision", value)
    assert code == 2
    assert err.strip().count("\n") == 0 and "--precision" in err and words in err


def test_types_of_different_formats_are_searched_together_under_one_precision(capsys) -> None:
    """An H100 (bf16, fp8) beside a V100 (fp16) is refused with the format both run as the fix;
    with it, both types are searched."""
    code, _, err = _search(capsys, cluster="h100-sxm-80gb,v100-sxm2-32gb")
    assert code == 2 and "give --precision fp16 (every type runs it)" in err
    code, data, _ = _search(capsys, "--precision", "fp16", cluster="h100-sxm-80gb,v100-sxm2-32gb")
    assert code == 0 and data["precisions"] == ["fp16"]
    assert {r["precision"] for r in data["top"]} == {"fp16"}
