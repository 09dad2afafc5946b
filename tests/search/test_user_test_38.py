"""User test 38's search findings: a search that falls back to sampling says how big the space
was and how to sample more (S4); the line under a --train-tokens table gives the days (N1); a
CPU profile is not told to measure "on those GPUs", and a small batch reads in tokens, not
"0.0010M" (N2); a multi-type search's best per GPU type, with each type's precision and band,
stands right under the ranked table (N6)."""

from __future__ import annotations

import io
import json
from typing import Any

from rich.console import Console

from autoplan.commands import main
from autoplan.cost.error_band import MfuCeiling
from autoplan.display import count, unvalidated_words
from autoplan.search.baseline import gain_text
from autoplan.search.engine import run_search
from autoplan.search.output import summary
from autoplan.search.render import header, render
from autoplan.search.sampled import choose_sampler
from autoplan.search.summary import by_cluster_lines
from tests.search.conftest import SMALL_SPACE, request


def small(max_enumerate: int) -> dict[str, Any]:
    return {**SMALL_SPACE, "max_enumerate": max_enumerate}


def test_the_default_sampler_falls_back_over_max_enumerate_and_says_the_space_size() -> None:
    whole = request(small(10**9))
    size = whole.space_size()
    assert choose_sampler(whole) == ("exhaustive", None)
    name, space = choose_sampler(request(small(size - 1)))
    assert name == "tpe" and space is not None and space.fallback
    assert (space.candidates, space.max_enumerate, space.num_gpus) == (size, size - 1, None)
    # --sampler chose: the space's size, not a fallback
    name, space = choose_sampler(request(small(10**9), sampler="random"))
    assert name == "random" and space is not None and not space.fallback
    assert space.candidates == size
    # a range falls back on its largest count's candidates, and names that count
    spread = request(small(10**9), gpus=(2, 4, 8))
    n, rows = spread.largest_count()
    name, space = choose_sampler(request(small(rows - 1), gpus=(2, 4, 8)))
    assert space is not None and (space.num_gpus, space.candidates) == (n, rows)
    assert rows == max(request(small(10**9), gpus=(k,)).space_size() for k in (2, 4, 8))


def test_a_fallen_back_search_says_so_in_its_header_and_json() -> None:
    req = request(small(100), trials=12)
    size = req.space_size()
    result = run_search(req)
    data = summary(result, top=3)
    assert result.sampler == "tpe" and data["trials"] == 12
    assert data["sampled_space"] == [{"cluster": "cpu-gloo", "candidates": size,
                                      "num_gpus": None, "max_enumerate": 100,
                                      "fallback": True}]
    line = header(data, req.model.seq_len)
    assert (f": tpe search (the space's {size:,} candidates exceed max_enumerate 100): 12 "
            f"trials, {data['scored']:,} scored, ") in line
    assert line.endswith("; --trials above 12 samples more")
    exhaustive = summary(run_search(request(small(10**9))), top=3)
    assert "sampled_space" not in exhaustive and "trials" not in exhaustive
    assert ": exhaustive search, " in header(exhaustive, req.model.seq_len)


def test_the_sampled_header_of_several_types_and_of_a_given_sampler() -> None:
    base = {"model": "m", "num_gpus": [8], "global_batch_size": 8, "space": "s",
            "runtime": "r", "candidates": 600, "scored": 50, "feasible_count": 40,
            "seconds": 1.0, "trials": 300}
    one = {"cluster": "a", "candidates": 7_000_000, "num_gpus": 64, "max_enumerate": 5_000_000,
           "fallback": True}
    text = header(base | {"cluster": "a,b", "sampler": "exhaustive,tpe",
                          "sampled_space": [one]}, 16)
    assert ("exhaustive,tpe search (a's 7,000,000 candidates at 64 GPUs exceed max_enumerate "
            "5,000,000): 600 candidates and trials, 50 scored") in text
    given = header(base | {"cluster": "a", "sampler": "random",
                           "sampled_space": [one | {"fallback": False, "num_gpus": None}]}, 16)
    assert "random search (of the space's 7,000,000 candidates): 600 trials," in given


def test_a_budget_line_gives_the_days_the_narrow_table_drops(capsys) -> None:
    argv = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
            "--global-batch-size", "8", "--train-tokens", "1e9", "--format", "table"]
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert main([*argv[:-1], "json"]) == 0
    first = json.loads(capsys.readouterr().out)["top"][0]
    from autoplan.display import days

    assert f"#1 for 1e9 tokens: {days(first['days'])} days at the priced step, " in text


def test_a_cpu_profile_is_measured_on_this_machine_and_a_small_batch_reads_whole(
        capsys) -> None:
    assert gain_text(1.01, 1.0, 0.25, cpu=True).endswith("(autoplan tune, on this machine)")
    assert gain_text(1.01, 1.0, 0.25).endswith("(autoplan tune, on those GPUs)")
    ceiling = MfuCeiling("megatron", "A100", "tp", "short", "16-bit", 0.3, "run-a", 0.25, 4)
    assert "(autoplan tune, on this machine)" in unvalidated_words(0.5, ceiling, cpu=True)
    assert "on those GPUs" in unvalidated_words(0.5, ceiling)
    assert [count(n) for n in (512, 1024, 9999, 32768, 999_950, 4_194_304)] == \
        ["512", "1,024", "9,999", "32.8k", "1.00M", "4.19M"]
    result = run_search(request(gbs=16))
    console = Console(width=200, record=True, file=io.StringIO())
    render(console, result, summary(result, top=3), 3)
    text = " ".join(console.export_text().split())
    assert "global batch 16 (1,024 tokens)," in text and "on those GPUs" not in text
    assert "measure both (autoplan tune, on this machine)" in text


BY_TYPE = {"cluster": "h100-sxm-80gb", "which": "h100-sxm-80gb", "feasible": True,
           "num_gpus": 64, "tokens_per_s": 95001.0, "step_s": 1.2345,
           "parallel": {"dp": 8, "tp": 8, "pp": 1, "cp": 1}}


def test_each_types_line_gives_its_precision_and_band() -> None:
    _, line = by_cluster_lines([BY_TYPE | {"precision": "fp8", "error_band": 0.22}],
                               ["throughput"])
    assert line == "  h100-sxm-80gb: 64 GPUs, dp=8 tp=8 pp=1 cp=1, fp8 (±22%), 95,001 tokens/s"


def test_the_types_lines_stand_between_the_table_and_the_counts(capsys) -> None:
    argv = ["search", "--model", "gpt3-125m", "--cluster", "a100-sxm4-80gb,h100-sxm-80gb",
            "--num-gpus", "8", "--global-batch-size", "64", "--precision", "bf16,fp8"]
    assert main([*argv, "--format", "table"]) == 0
    text = capsys.readouterr().out
    assert main([*argv, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["by_cluster"]
    start = text.index("best per GPU type")
    assert text.rindex("─", 0, start) > text.index(" # ")  # the ranked table is above
    assert start < text.index("why this plan") < text.index("candidates by outcome")
    for r in rows:
        assert r["precision"] in ("bf16", "fp8") and isinstance(r["error_band"], float)
        assert f"cp={r['parallel']['cp']}, {r['precision']} (±{r['error_band']:.0%}), " \
            in text[start:].splitlines()[1 + rows.index(r)]
