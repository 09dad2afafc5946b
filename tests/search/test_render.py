"""The terminal view of a search (issue #16 item 3/4): fits 80 columns with nothing cut,
explains its abbreviations, shares a row between equivalent plans, says why the winner wins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoplan.display import column, count, rounded, sig
from autoplan.search.rows import collapse, days_cell, mem_cell, sched_cell, step_cell, zero_cell
from autoplan.search.table import legend, ranked_table

ROOT = Path(__file__).resolve().parents[2]
MAIN_JOB = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
            "--global-batch-size", "1536"]


def cli(argv: list[str], columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)


def row(**kw):
    base = {"num_gpus": 8, "dp": 1, "tp": 8, "pp": 1, "cp": 1, "sp": True, "schedule": "1f1b",
            "vpp": 1, "split": "even", "zero": 0, "offload_optimizer": False,
            "offload_params": False, "recompute": "none", "recompute_layers": -1, "mbs": 1,
            "precision": "bf16", "attention": "flash", "mem_gib": 40.0, "step_s": 2.0,
            "tokens_per_s": 1000.0, "mfu": 0.5, "dominant": "compute"}
    return base | kw


def test_equal_zero_stages_and_splits_share_a_row_and_different_figures_do_not() -> None:
    rows = [row(zero=z) for z in range(4)] + [row(tp=4, pp=2, split="even"),
                                              row(tp=4, pp=2, split="balanced"),
                                              row(tp=4, pp=2, zero=1, step_s=2.5)]
    shown = collapse(rows, limit=10)
    assert [s.rank for s in shown] == [1, 5, 7]
    assert zero_cell(shown[0]) == "0-3" and shown[1].splits == ["balanced", "even"]
    assert zero_cell(shown[2]) == "1"
    text = legend(shown, wide=False)
    assert "equal at dp 1" in text and "a=b = splits that score the same" in text
    assert "sp y" in text and "bal = layers balanced" in text
    assert sched_cell(shown[1].row, shown[1].splits).endswith(" bal=even")
    # every split by its own name, table and legend alike (the JSON's `split`)
    for split, short, words in (("ends", "ends", "one layer lighter"),
                                ("embed-loss", "emb", "stages of their own"),
                                ("deepspeed", "ds", "DeepSpeed's partition")):
        (one,) = collapse([row(tp=4, pp=2, split=split)], limit=10)
        assert sched_cell(one.row, one.splits).endswith(" " + short)
        assert words in legend([one], wide=False)
    # the limit counts distinct rows
    assert len(collapse(rows, limit=1)) == 1


def test_band_shows_beside_the_step_time() -> None:
    assert step_cell(row(step_s=20.31, band=0.09)) == "20.3 ±9%"
    assert step_cell(row(step_s=20.31)) == "20.3"


def test_a_tight_plan_is_marked_and_the_legend_says_why() -> None:
    """mem_tight_gib > 0 (ranking.frame: fits at the allocator's median slack, not at its 75th
    percentile) puts "!" after the GiB figure, and the legend explains the mark only then."""
    tight, roomy = row(mem_gib=78.4, mem_tight_gib=1.4), row(tp=4, pp=2, mem_gib=60.0,
                                                             mem_tight_gib=0.0)
    assert mem_cell(tight) == "78.4!" and mem_cell(roomy) == "60.0" == mem_cell(row(mem_gib=60))
    both = collapse([tight, roomy], 10)
    assert "GiB! = tight" in legend(both, wide=False)
    assert "tight" not in legend(collapse([roomy], 10), wide=False)


def test_the_legend_says_an_fp8_rows_mfu_is_against_the_fp8_peak() -> None:
    """An fp8 plan at 1.49x a bf16 plan's tokens/s showed the lower MFU (34.8% against 46.8%),
    against the fp8 peak, and nothing said which peak."""
    assert "fp8's, twice bf16's" in legend(collapse([row(precision="fp8")], 10), wide=False)
    assert "fp8's" not in legend(collapse([row()], 10), wide=False)


def test_cost_without_a_token_budget_says_what_its_figures_count() -> None:
    """--objective cost without --train-tokens prices GPU-hours (and dollars) per 1e9 tokens
    (targets.COST_TOKENS_DEFAULT): the legend says so; with a budget (days shown) it does not."""
    per = collapse([row(gpu_hours=51.0)], 10)
    assert "per 1,000,000,000 tokens" in legend(per, wide=False)
    budget = collapse([row(gpu_hours=51.0, days=2.0)], 10)
    assert "tokens (--train-tokens" not in legend(budget, wide=False)


def test_narrow_layout_hoists_shared_knobs_and_wide_keeps_every_column() -> None:
    shown = collapse([row(zero=1, tp=t, dp=8 // t) for t in (1, 2, 8)], 10)
    _, shared, _ = ranked_table(shown, "t", ["throughput"], wide=False, width=80)
    assert "ZeRO 1" in shared and "sequence parallel yes" in shared
    table, shared, dropped = ranked_table(shown, "t", ["throughput"], wide=True)
    assert shared == [] and dropped == []
    assert {"zero", "recompute", "dominant", "offload"} <= {c.header for c in table.columns}
    # rows differing only in attention (eager vs flash) looked identical without these
    assert {"precision", "attention"} <= {c.header for c in table.columns}


def test_a_gpu_count_search_names_the_count_its_plans_share() -> None:
    shown = collapse([row(num_gpus=64, tp=t, dp=64 // t) for t in (1, 2)], 10)
    _, shared, _ = ranked_table(shown, "t", ["gpus"], wide=False, width=80, one_count=False)
    assert "GPUs 64" in shared
    _, shared, _ = ranked_table(shown, "t", ["gpus"], wide=False, width=80, one_count=True)
    assert not any(s.startswith("GPUs") for s in shared)


def test_numbers_at_sensible_figures() -> None:
    assert sig(0.0006992) == "0.000699" and sig(131.31648302078247) == "131"
    assert column([3.468, 0.0, 0.2151, 0.0006992], 4.056) == ["3.47", "0", "0.22", "<0.01"]
    assert count(240_000) == "240k" and count(8.03e9) == "8.03B"
    assert rounded({"a": [131.31648302078247, 3], "b": True}) == {"a": [131.3, 3], "b": True}


def test_main_job_fits_80_columns_with_a_legend_and_a_why_line() -> None:
    proc = cli([*MAIN_JOB, "--format", "table"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "…" not in proc.stdout
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if line.lstrip().startswith("#"))
    for col in ("dp", "tp", "pp", "step s", "tok/s", "MFU"):
        assert re.search(rf"(^|\s){re.escape(col)}(\s|$)", header), col
    text = " ".join(lines)
    assert "legend:" in text and "zb = zero-bubble" in text
    assert "why this plan:" in text and "Korthikanti" in text
    wide = cli([*MAIN_JOB, "--format", "table", "--wide"])
    assert "dominant" in wide.stdout and "…" not in wide.stdout
    assert max(len(line) for line in wide.stdout.splitlines()) > 80


def test_yaml_rounds_for_people_and_json_keeps_every_digit() -> None:
    small = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
             "--global-batch-size", "16", "--top", "2"]
    as_json = json.loads(cli([*small, "--format", "json"]).stdout)
    as_yaml = yaml.safe_load(cli([*small, "--format", "yaml"]).stdout)
    full, short = as_json["top"][0]["step_s"], as_yaml["top"][0]["step_s"]
    assert short == float(f"{full:.4g}") and len(repr(full)) > len(repr(short))


def test_models_and_clusters_fit_80_columns_without_cutting_names() -> None:
    for what in ("models", "clusters"):
        proc = cli([what, "--format", "table"])
        assert proc.returncode == 0, proc.stderr
        assert "…" not in proc.stdout
        assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    models = cli(["models", "--format", "table"]).stdout
    assert "llama-3.1-405b" in models and re.search(r"tiny\s+237k\s", models)


def test_every_published_recipe_loads_as_a_plan_of_its_models() -> None:
    from types import SimpleNamespace

    from autoplan.search.baseline import load_baselines, score_baseline

    from .conftest import request

    for recipe in load_baselines():
        assert recipe["source"] and recipe["models"]
        mp = recipe["parallel"]["tp"] * recipe["parallel"]["pp"] * recipe["parallel"]["cp"]
        for model in recipe["models"]:
            req = request("default", model=model, cluster="h100-sxm-80gb", gpus=(mp * 8,),
                          gbs=mp * 8 * 4)
            score = score_baseline(SimpleNamespace(request=req), mp * 8)
            assert score is not None and score.step_s > 0 and score.name == recipe["name"]
            assert score_baseline(SimpleNamespace(request=req), mp * 8 + 1) is None


def test_the_published_recipe_is_priced_under_the_searchs_runtime() -> None:
    """The 'why this plan' gain compares like with like: under --runtime megatron the recipe
    is priced as Megatron runs it, not as autoplan's runtime would."""
    from dataclasses import replace
    from types import SimpleNamespace

    from autoplan.cost.runtimes import load_runtime
    from autoplan.search.baseline import score_baseline

    from .conftest import request

    req = request("default", model="gpt3-175b", cluster="a100-sxm4-80gb", gpus=(1024,),
                  gbs=1536)
    own = score_baseline(SimpleNamespace(request=req), 1024)
    mega = score_baseline(SimpleNamespace(request=replace(req, runtime=load_runtime("megatron"))),
                          1024)
    assert own is not None and mega is not None and mega.step_s != pytest.approx(own.step_s)


def test_the_published_recipe_is_priced_in_the_winners_precision() -> None:
    """An FP8 winner was compared with the recipe priced in BF16, crediting the layout with
    FP8's speed (+33% for the recipe's own layout); the recipe is priced in the precision the
    winner runs and its layout says which."""
    from types import SimpleNamespace

    from autoplan.search.baseline import score_baseline

    from .conftest import request

    req = request("default", model="llama-3-8b", cluster="h100-sxm-80gb", gpus=(64,), gbs=512)
    bf16 = score_baseline(SimpleNamespace(request=req), 64)
    fp8 = score_baseline(SimpleNamespace(request=req), 64, precision="fp8")
    assert bf16 is not None and fp8 is not None
    assert bf16.layout.endswith(" bf16") and fp8.layout.endswith(" fp8")
    assert fp8.step_s < bf16.step_s


def test_a_recipe_a_runtime_rule_refuses_cannot_run_rather_than_does_not_fit() -> None:
    """NeMo's Llama 3 70B recipe in fp8 at tp 4 was said not to "fit" 64 H100s, when autoplan's
    runtime refuses fp8 with tensor parallelism; memory alone does not fit."""
    from types import SimpleNamespace

    from autoplan.search.baseline import score_baseline, verdict

    from .conftest import request

    req = request("default", model="llama-3.1-70b", cluster="h100-sxm-80gb", gpus=(64,),
                  gbs=128)
    fp8 = score_baseline(SimpleNamespace(request=req), 64, precision="fp8")
    assert fp8 is not None and not fp8.feasible
    assert verdict(fp8.reasons) == "cannot run", fp8.reasons
    assert verdict(("needs 425.2 GiB per GPU of 79.2 GiB (short by 346.0 GiB)",)) == \
        "does not fit"


def test_a_short_run_s_days_keep_two_significant_digits() -> None:
    """1e9 tokens on 16 A100s read 'days 0.0'."""
    assert days_cell({"days": 0.0432}) == "0.043"
    assert days_cell({"days": 1e-5}) == "0.000010"  # no exponent
    assert days_cell({"days": 12.34}) == "12.3"
    assert days_cell({}) == "-"


def test_a_short_list_of_gpu_counts_reads_as_a_list() -> None:
    """`--num-gpus 2,8` printed "on 2..8 (2 counts)", which reads as every count between."""
    done = cli(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2,8",
                "--global-batch-size", "16", "--space", "small-cpu", "--top", "2",
                "--format", "table"], columns=200)
    assert done.returncode == 0, done.stderr
    assert "tiny on 2 or 8 x cpu-gloo" in done.stdout and "2..8" not in done.stdout


def test_gpu_counts_read_as_the_user_gave_them() -> None:
    """`--num-gpus 8,16,32,64,128` printed "on 8..128 (5 counts)", which reads as every count
    between; a typed range stays a range, a long list is shortened with its count."""
    from autoplan.search.render import counts_text

    assert counts_text([8, 16, 32, 64, 128]) == "8, 16, 32, 64 or 128"
    assert counts_text([8, 16, 32, 64, 128], [8, 128]) == "8..128 (5 counts)"
    assert counts_text([1, 2, 4, 8], [1, 8]) == "1, 2, 4 or 8"  # a few counts: the counts
    assert counts_text(list(range(8, 8 * 15, 8))) == ("8, 16, 24, 32, 40, 48, 56, 64, 72, 80, "
                                                      "..., 112 (14 counts)")
    listed = cli(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus",
                  "1,2,3,4,6", "--global-batch-size", "12", "--space", "small-cpu", "--top",
                  "1", "--format", "json"])
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["num_gpus"] == [1, 2, 3, 4, 6] and "num_gpus_range" not in data
    typed = cli(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1..32",
                 "--global-batch-size", "32", "--space", "small-cpu", "--top", "1",
                 "--format", "json"])
    assert typed.returncode == 0, typed.stderr
    assert json.loads(typed.stdout)["num_gpus_range"] == [1, 32]


def test_a_typed_list_of_five_counts_prints_as_that_list() -> None:
    done = cli(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1,2,3,4,6",
                "--global-batch-size", "12", "--space", "small-cpu", "--top", "1",
                "--format", "table"], columns=200)
    assert done.returncode == 0, done.stderr
    assert "tiny on 1, 2, 3, 4 or 6 x cpu-gloo" in done.stdout and "1..6" not in done.stdout


def test_figures_past_any_clusters_reach_print_short() -> None:
    """--train-tokens 1e30 printed "85938006903806640128.0" days in the table and the nearest
    miss, and --min-tokens-per-s 1e30 every digit of the float."""
    from autoplan.display import whole
    from autoplan.search.rows import usd_cell

    assert days_cell({"days": 8.5938e19}) == "8.59e+19"
    assert days_cell({"days": 123_456.7}) == "123,000" and days_cell({"days": 999.94}) == "999.9"
    assert whole(1e30) == "1e+30" and whole(1_500_000.4) == "1,500,000"
    assert usd_cell({"usd": 2.15e22}) == "2.15e+22" and usd_cell({"usd": float("nan")}) == "-"
    done = cli(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "2",
                "--global-batch-size", "16", "--space", "small-cpu", "--min-tokens-per-s",
                "1e30", "--format", "json"])
    assert done.returncode == 3
    assert "tokens/s of at least 1e+30" in done.stderr and "000,000,000" not in done.stderr


def test_a_table_of_one_plan_says_plan() -> None:
    """A one-plan front was titled "Pareto front (1 plans; ...)"."""
    from autoplan.search.render import table_title

    front = {"pareto_size": 1, "objectives": ["throughput", "cost"], "top": [{}]}
    assert table_title(front, True, False) == "Pareto front (1 plan; throughput vs cost)"
    assert table_title(front | {"pareto_size": 5}, True, False).startswith("Pareto front (5 plans")
    ranked = {"objectives": ["latency"], "top": [{}]}
    assert table_title(ranked, False, False) == "top 1 plan by latency"
    assert table_title(ranked | {"top": [{}, {}]}, False, True) == \
        "top 2 plans by latency (equivalent plans share a row)"


def test_the_nearest_miss_prices_again_under_estimate_set() -> None:
    """llama-3.1-405b on 8 x A100-40GB misses by 64.7 GiB with ZeRO-3 and its parameters
    offloaded: the line named neither the offload nor how to price that figure again. Its
    words are `estimate --set` assignments, and estimate with them prints the same need."""
    job = ["--model", "llama-3.1-405b", "--cluster", "a100-sxm4-40gb", "--num-gpus", "8",
           "--global-batch-size", "8"]
    done = cli(["search", *job, "--format", "table"], columns=80)  # one line however narrow
    assert done.returncode == 3, done.stderr
    line = next(x for x in done.stdout.splitlines() if "no feasible plan." in x)
    sets = line.split("nearest (as estimate --set): ")[1].split(", which")[0]
    assert sets == ("parallel.dp=8 parallel.tp=1 parallel.pp=1 parallel.cp=1 "
                    "batch.micro_batch_size=1 batch.global_batch_size=8 precision=bf16 "
                    "attention=flash zero_stage=3 offload.params=true recompute.policy=full")
    need = re.search(r"needs (\d+\.\d) GiB of 39.6 GiB per GPU", done.stdout)
    assert need is not None, done.stdout
    again = cli(["estimate", *job, "--set", *sets.split(), "--format", "json"])
    assert f"needs {need.group(1)} GiB per GPU of 39.6 GiB" in again.stdout, again.stdout


def test_miss_knobs_name_every_field_away_from_the_default_as_set_keys() -> None:
    from autoplan.search.render import miss_knobs

    base = {"model": "llama-3-8b", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 8},
            "batch": {"micro_batch_size": 2, "global_batch_size": 8}}
    plan = base | {"parallel": {"dp": 2, "tp": 4}, "zero_stage": 1,
                   "offload": {"optimizer": True, "params": True},
                   "recompute": {"policy": "full", "num_layers": 3, "method": "uniform"}}
    assert miss_knobs(plan) == (
        "parallel.dp=2 parallel.tp=4 parallel.pp=1 parallel.cp=1 batch.micro_batch_size=2 "
        "batch.global_batch_size=8 precision=bf16 attention=flash zero_stage=1 "
        "offload.optimizer=true "
        "offload.params=true recompute.policy=full recompute.num_layers=3 "
        "recompute.method=uniform")
    plan = base | {"parallel": {"dp": 1, "tp": 4, "pp": 2}, "sequence_parallel": True,
                   "pipeline": {"schedule": "interleaved-1f1b", "vpp": 2}, "precision": "fp32",
                   "attention": "eager",
                   "recompute": {"policy": "selective", "modules": ["core_attn", "mlp"]}}
    assert miss_knobs(plan).endswith(
        "batch.micro_batch_size=2 batch.global_batch_size=8 precision=fp32 attention=eager "
        "sequence_parallel=true pipeline.schedule=interleaved-1f1b pipeline.vpp=2 "
        "recompute.policy=selective 'recompute.modules=[core_attn,mlp]'")


def test_the_nearest_miss_of_several_gpu_counts_names_its_count() -> None:
    """estimate takes one GPU count: with --num-gpus 8,16 the miss says which one it is on."""
    done = cli(["search", "--model", "llama-3.1-405b", "--cluster", "a100-sxm4-40gb",
                "--num-gpus", "8,16", "--global-batch-size", "16", "--format", "table"])
    assert done.returncode == 3, done.stderr
    assert "nearest on 16 x a100-sxm4-40gb (as estimate --set): parallel.dp=16 " in done.stdout
    # the table shows the miss; stderr does not say it again (user test 37), JSON's stderr does
    assert "as estimate --set" not in done.stderr and "nearest miss" in done.stderr
    done = cli(["search", "--model", "llama-3.1-405b", "--cluster", "a100-sxm4-40gb",
                "--num-gpus", "8,16", "--global-batch-size", "16", "--format", "json"])
    assert "nearest (out-of-memory) on 16 x a100-sxm4-40gb (as estimate --set) " in done.stderr
