"""Search output a user can act on (user test 37, findings 4, 5, 6, 13 and 15): the table says
how many plans its rows hold and folds recompute variants that buy nothing, `par`/`o+p` pairs
that price the same share a row, a token budget's cost is on a line under the table, a tight
winner names the best plan that fits at the 75th-percentile slack, an fp8 winner whose runs
lean far past its margin names the best plan of the other precision (and that autoplan's runtime
trains fp8 through torchao, user test 37's nit), and exit 3 says which GPU
counts to search next, once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoplan.search.notes import cost_line, fold_line, fp8_line, ranks_text
from autoplan.search.render import table_title
from autoplan.search.rows import collapse, offload_cell
from autoplan.search.table import layout, legend

ROOT = Path(__file__).resolve().parents[2]
MAIN_JOB = ["--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
            "--global-batch-size", "1536"]
QWEN_2 = ["--model", "qwen3-30b-a3b", "--cluster", "h200-sxm-141gb", "--num-gpus", "2",
          "--global-batch-size", "256"]
QWEN_235 = ["--model", "qwen3-235b-a22b", "--cluster", "h200-sxm-141gb",
            "--global-batch-size", "256"]


def cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), "search", *argv],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def row(**kw: Any) -> dict[str, Any]:
    base = {"num_gpus": 8, "dp": 8, "tp": 1, "pp": 1, "cp": 1, "sp": False, "schedule": "1f1b",
            "vpp": 1, "split": "even", "zero": 1, "offload_optimizer": False,
            "offload_params": False, "recompute": "none", "recompute_layers": -1, "mbs": 1,
            "precision": "bf16", "attention": "flash", "mem_gib": 70.0, "step_s": 2.0,
            "tokens_per_s": 1000.0, "mfu": 0.5, "dominant": "compute", "mem_tight_gib": 0.0}
    return base | kw


def test_slower_recompute_variants_fold_into_the_plan_that_fits_without_them() -> None:
    """Rows 2-5 and 7 of the Llama 8B table were the winner with recompute on 1-4 layers: they
    fold into its row, and the line under the table names them; the report's collapse (no
    fold) keeps them."""
    rows = [row(), row(recompute="selective", recompute_layers=1, step_s=2.1, mem_gib=69.0),
            row(dp=4, cp=2, step_s=2.2, tokens_per_s=900.0),
            row(recompute="full", recompute_layers=2, step_s=2.3, tokens_per_s=850.0)]
    shown = collapse(rows, 10, fold=True)
    assert [s.rank for s in shown] == [1, 3]
    assert shown[0].folded == [(2, "sel:1"), (4, "full:2")]
    line = fold_line(shown, None, 10)
    assert line is not None and "#2, #4 = #1 with recompute sel:1, full:2" in line
    assert [s.rank for s in collapse(rows, 10)] == [1, 2, 3, 4]
    # the --top that fills the table's rows: in the fold sentence, or alone in parentheses
    assert fold_line(shown, 12, 10) == f"{line} (--top 12 fills the table's 10 rows)"
    (alone,) = collapse(rows[:1], 10, fold=True)
    assert fold_line([alone], 19, 10) == "(--top 19 fills the table's 10 rows)"
    assert fold_line([alone], None, 10) is None


def test_a_recompute_variant_that_fits_where_the_plan_is_tight_keeps_its_row() -> None:
    """A tight (GiB!) plan's recompute variant that fits at the 75th-percentile slack is a real
    alternative (finding 15), not a slower copy."""
    rows = [row(mem_tight_gib=0.5),
            row(recompute="selective", recompute_layers=1, step_s=2.1, mem_tight_gib=0.0)]
    assert [s.rank for s in collapse(rows, 10, fold=True)] == [1, 2]
    both_tight = [rows[0], rows[1] | {"mem_tight_gib": 0.1}]
    assert [s.rank for s in collapse(both_tight, 10, fold=True)] == [1]


def test_parameters_offloaded_alone_or_with_the_optimizer_share_a_row_when_priced_alike() -> None:
    par = row(offload_params=True, zero=3, host_gib=227.5)
    same, other_host = par | {"offload_optimizer": True}, par | {"offload_optimizer": True,
                                                                "host_gib": 300.0}
    (shown,) = collapse([par, same], 10)
    assert shown.optimizers == [False, True] and offload_cell(shown.row, False,
                                                              shown.optimizers) == "p=o+p"
    assert "p=o+p = the parameters alone or with the optimizer states" in legend([shown], False)
    assert "par = parameters" not in legend([shown], False)
    assert len(collapse([par, other_host], 10)) == 2  # the host holds more: not the same plan


def test_the_title_says_how_many_rows_hold_the_plans() -> None:
    data = {"objectives": ["throughput"], "top": [{}] * 10}
    assert table_title(data, False, True, 5) == \
        "top 10 plans by throughput, in 5 rows (equivalent plans share a row)"
    assert table_title(data, False, False, 10) == "top 10 plans by throughput"
    assert table_title(data, False, False, 1) == "top 10 plans by throughput, in 1 row"
    assert ranks_text([2, 3, 4, 5, 7, 9, 10]) == "#2-5, #7, #9-10"


def test_a_token_budget_prices_plan_1_under_the_table_and_wide_adds_the_columns() -> None:
    data = {"targets": {"train_tokens": 1e12}, "cluster": "h100-sxm-80gb"}
    shown = collapse([row(days=15.7, gpu_hours=24158.0, usd=72473.0)], 10)
    assert cost_line(data, shown) == ("#1 for 1e12 tokens: 15.7 days at the priced step, "
                                      "24,158 GPU-hours, $72,473 at "
                                      "$3.00/GPU-h (--price h100-sxm-80gb=USD to change)")
    unpriced = collapse([row(days=15.7, gpu_hours=24158.0, usd=None)], 10)
    line = cost_line(data, unpriced)
    assert line is not None and "no price" in line and "--price h100-sxm-80gb=USD" in line
    assert cost_line({"targets": {"train_tokens": None}, "cluster": "x"}, shown) is None
    narrow, _, dropped = layout(shown, ["throughput"], False, 80)
    assert dropped[:2] == ["gpu_hours", "usd"] and "days" in {c[0] for c in narrow}
    wide, _, _ = layout(shown, ["throughput"], True, 80)
    assert {"gpu_hours", "usd"} <= {c[0] for c in wide}
    costed, _, _ = layout(shown, ["cost"], False, 80)  # the objective's column stays
    assert "usd" in {c[0] for c in costed}


def test_the_main_job_says_plan_1_is_tight_and_which_plan_fits_at_p75() -> None:
    """The README's main job: #1 is 78.4! GiB; the line names #3, the plan `--memory-slack
    p75` makes the winner, and what #1 gains over it in tokens/s, counted from #1's side as the
    why line counts its gain over the same #3 (they printed +0.9% and -0.8%)."""
    table = cli([*MAIN_JOB, "--format", "table"])
    assert table.returncode == 0, table.stderr
    assert "top 10 plans by throughput, in 5 rows (equivalent plans share a row)" in table.stdout
    assert max(len(line) for line in table.stdout.splitlines()) <= 80
    data = json.loads(cli([*MAIN_JOB, "--format", "json"]).stdout)
    alt = data["p75_alternative"]
    assert data["top"][0]["mem_tight_gib"] > 0 and alt["rank"] > 1
    said = " ".join(table.stdout.split())
    gain = data["top"][0]["tokens_per_s"] / alt["tokens_per_s"] - 1.0
    assert (f"#1 is tight (GiB!): the best plan that also fits at the allocator's "
            f"75th-percentile slack is #{alt['rank']} (#1 against it: {gain:+.1%} tokens/s)"
            ) in said
    assert alt["change"] < 0 < gain  # the JSON's change stays the alternative's own
    why = re.search(r"why this plan: against the next different layout \(#(\d+), [^)]*\) "
                    r"([+-][\d.]+%) tokens/s", said)
    assert why is not None and int(why[1]) == alt["rank"] and why[2] == f"{gain:+.1%}"
    p75 = json.loads(cli([*MAIN_JOB, "--memory-slack", "p75", "--format", "json"]).stdout)
    layout_keys = ("dp", "tp", "pp", "cp")
    assert {k: p75["best"]["parallel"][k] for k in layout_keys} == \
        {k: alt["parallel"][k] for k in layout_keys}
    assert p75["best"]["predicted"]["tokens_per_s"] == pytest.approx(alt["tokens_per_s"])
    assert "p75_alternative" not in p75  # nothing is tight under p75


def test_an_fp8_winner_whose_runs_lean_past_its_margin_names_the_bf16_plan() -> None:
    """Qwen3-30B-A3B on 2 x H200: fp8 wins by 4% as priced, but fp8 MoE runs took over 100%
    longer than priced: the line names the best bf16 plan and says measure both; the ranking and the
    predictions are the cost model's as they stand. Rows that differ only in precision keep the
    precision column, and par/o+p pairs share a row."""
    done = cli([*QWEN_2, "--format", "json"])
    data = json.loads(done.stdout)
    o = data["other_precision"]
    assert data["top"][0]["precision"] == o["winner"]["precision"] == "fp8"
    assert o["precision"] == "bf16" and o["lean_flips"] and o["moe"]
    assert o["winner"]["error_bias"] > o["slower_as_priced"] > 0
    best = data["best"]["predicted"]
    assert best["step_time_s"] == data["top"][0]["step_s"]  # no lean added
    table = cli([*QWEN_2, "--format", "table"])
    said = " ".join(table.stdout.split())
    lean = o["winner"]["error_bias"]  # the fp8 MoE runs' mean lean, from error_bands.yaml
    assert 1.0 < lean < 1.5
    assert (f"but the best bf16 plan (#{o['rank']}, " in said and "slower as priced" in said
            and f"which took {lean:.0%} longer than priced on average" in said
            and said.count("measure both") >= 2)
    assert "#1 is fp8: `autoplan train` runs it through torchao's float8 layers" in said
    assert "`pip install torchao` where it trains" in said
    header = next(line for line in table.stdout.splitlines() if line.lstrip().startswith("#"))
    assert "prec" in header.split() and "p=o+p" in table.stdout


def test_the_torchao_line_is_only_for_an_fp8_winner_of_autoplans_runtime() -> None:
    """torchao is said where #1 is fp8 and autoplan's runtime trains it; a bf16 winner, or an
    fp8 one priced for Megatron-Core (Transformer Engine's fp8), gets no line."""
    fp8 = {"top": [row(precision="fp8")], "runtime": "autoplan-cuda"}
    assert fp8_line(fp8) is not None and "torchao" in str(fp8_line(fp8))
    assert fp8_line({**fp8, "top": [row()]}) is None
    assert fp8_line({**fp8, "runtime": "megatron"}) is None
    assert fp8_line({"top": [], "runtime": "autoplan-cuda"}) is None


def test_exit_3_names_a_gpu_range_that_holds_a_plan_and_says_it_once() -> None:
    """Qwen3-235B-A22B on 2 x H200 misses memory; the line suggests a --num-gpus range for an
    `--objective gpus` search, which finds a count that fits. In table mode stderr does not
    repeat what the table shows."""
    table = cli([*QWEN_235, "--num-gpus", "2", "--format", "table"])
    assert table.returncode == 3
    said = " ".join(table.stdout.split())
    assert "to find the fewest GPUs that fit: try --num-gpus 4..64 --objective gpus" in said
    err = table.stderr.strip().splitlines()
    # with --format table > FILE stderr is what the terminal shows: the range is there, short
    assert len(err) == 1 and "as estimate --set" not in err[0] and "on stdout" in err[0]
    assert err[0].endswith("the nearest miss (out-of-memory) is on stdout; to find the fewest "
                           "GPUs that fit: try --num-gpus 4..64 --objective gpus")
    assert "needs 153.6 GiB" in table.stdout and "needs 153.6 GiB" not in table.stderr
    failed = cli([*QWEN_235, "--num-gpus", "2", "--format", "json"])
    more = json.loads(failed.stdout)["nearest"]["more_gpus"]
    assert more["num_gpus"] == "4..64" and more["from"] == 2 and more["short"] > 0
    assert "try --num-gpus 4..64 --objective gpus" in failed.stderr  # the one full line
    found = cli([*QWEN_235, "--num-gpus", more["num_gpus"], "--objective", "gpus",
                 "--format", "json"])
    fits = json.loads(found.stdout)
    assert found.returncode == 0 and 4 <= fits["best"]["cluster"]["num_gpus"] <= 64


def test_a_missed_deadline_names_counts_above_the_ones_searched() -> None:
    done = cli(["--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                "--global-batch-size", "16", "--train-tokens", "1e10", "--deadline-days", "1",
                "--format", "json"])
    assert done.returncode == 3
    more = json.loads(done.stdout)["nearest"]["more_gpus"]
    lo, hi = map(int, more["num_gpus"].split(".."))
    assert lo > 4 and lo <= more["proportional"] < hi
    assert "fewest GPUs that meet the targets" in done.stderr


def test_the_shared_line_says_sequence_parallel_no_where_others_say_yes() -> None:
    """A knob every row shares moves to the line above the table: sequence parallelism is yes
    or no there (it read "none" in some searches, "yes" in others), what is on the host and
    the recompute still "none"."""
    rows = [row(), row(dp=4, cp=2, step_s=2.2, tokens_per_s=900.0)]
    _, shared, _ = layout(collapse(rows, 10), ["throughput"], False, 80)
    assert "sequence parallel no" in shared
    assert {"offload none", "recompute none"} <= set(shared)
    _, with_sp, _ = layout(collapse([r | {"sp": True} for r in rows], 10), ["throughput"],
                           False, 80)
    assert "sequence parallel yes" in with_sp
