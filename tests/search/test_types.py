"""GPU type as a search dimension, prices, and the device's own precision (issue #12 items 2, 3):
a three-type search names the cheapest cluster of each type and overall in one run, every
output names the profile of each plan, and V100 searches run in fp16."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from autoplan.commands import build_parser, main
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile, profile_from_dict
from autoplan.plan import Precision
from autoplan.plan_files import load_plan
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.summary import best_by_cluster

TYPES = "a100-sxm4-80gb,h100-sxm-80gb,h200-sxm-141gb"
JOB = ["search", "--model", "gpt3-13b", "--num-gpus", "32", "--global-batch-size", "1024",
       "--objective", "cost", "--deadline-days", "30", "--train-tokens", "300e9"]


def run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_three_types_print_the_cheapest_of_each_and_overall(capsys) -> None:
    job = [*JOB, "--num-gpus", "32,64"]  # A100s need 64 for the deadline, H100s 32
    code, text, err = run(job + ["--cluster", TYPES, "--format", "table"], capsys)
    assert code == 0, err
    lines = text[text.index("best per GPU type"):].replace("\n", " ")
    res = run_search(build_request(build_parser().parse_args(job + ["--cluster", TYPES])))
    rows = {r["which"]: r for r in best_by_cluster(res)}
    assert set(rows) == {*TYPES.split(","), "overall"}
    c = res.scored.cols
    for k, name in enumerate(TYPES.split(",")):
        r = rows[name]
        assert r["feasible"] and r["days"] <= 30 and r["cluster"] == name
        assert f"{name}: {r['num_gpus']} GPUs" in lines and f"${r['usd']:,.0f}" in lines
        assert r["usd"] == pytest.approx(r["gpu_hours"] * load_profile(name).price_per_gpu_hour)
        mine = res.scored.feasible & (c["cluster"] == k)  # no cheaper plan of that type
        usd = c["num_gpus"][mine] * 300e9 / c["tokens_per_s"][mine] / 3600 \
            * load_profile(name).price_per_gpu_hour
        assert r["usd"] == pytest.approx(usd.min(), rel=1e-12)
    cheapest = min((rows[n] for n in TYPES.split(",")), key=lambda r: r["usd"])
    assert rows["overall"]["cluster"] == cheapest["cluster"]
    assert rows["overall"]["usd"] == cheapest["usd"]
    assert f"overall: {cheapest['num_gpus']} GPUs of {cheapest['cluster']}" in lines


SMALL = {"schema_version": 1, "name": "types-small", "parallel": {"tp": [1, 2], "pp": [1, 2]},
         "zero_stage": [1], "micro_batch_size": [1, 2], "precision": "auto"}


def test_every_output_names_the_profile_of_each_plan(tmp_path: Path, capsys) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL), encoding="utf-8")
    out = tmp_path / "out"
    code, text, err = run(JOB + ["--cluster", TYPES, "--space", str(space), "--out", str(out),
                                 "--format", "table", "--wide"], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    overall = summary["by_cluster"][-1]
    plan = load_plan(out / "plan.yaml")
    assert (plan.cluster.profile, plan.cluster.num_gpus) == (overall["cluster"],
                                                            overall["num_gpus"])
    top = yaml.safe_load((out / "top.yaml").read_text())["plans"]
    assert [p["cluster"]["profile"] for p in top] == [r["cluster"] for r in summary["top"]]
    with gzip.open(out / "trials.csv.gz", "rt") as fh:
        header = fh.readline().strip().split(",")
        clusters = {line.rstrip("\n").split(",")[header.index("cluster")] for line in fh}
    assert clusters == set(TYPES.split(","))
    table = text[:text.index("best per GPU type")]
    assert "gpu type" in table and all(r["cluster"] in table for r in summary["top"])


def test_price_override_changes_the_cheapest_type() -> None:
    job = JOB[:JOB.index("--deadline-days")] + ["--train-tokens", "300e9", "--num-gpus", "32"]
    base = run_search(build_request(build_parser().parse_args(
        job + ["--cluster", "a100-sxm4-80gb,h100-sxm-80gb"])))
    first = base.scored.clusters[int(base.scored.cols["cluster"][base.best])]
    other = "a100-sxm4-80gb" if first == "h100-sxm-80gb" else "h100-sxm-80gb"
    cheap = run_search(build_request(build_parser().parse_args(
        job + ["--cluster", "a100-sxm4-80gb,h100-sxm-80gb", "--price", f"{other}=0.01"])))
    assert cheap.scored.clusters[int(cheap.scored.cols["cluster"][cheap.best])] == other


@pytest.mark.parametrize("price,word", [("h100-sxm-80gb", "NAME=USD"),
                                        ("h100-sxm-80gb=nan", "NAME=USD"),
                                        ("h100-sxm-80gb=-1", "expected a price per GPU-hour "
                                         "above 0 and below 1,000,000 US dollars"),
                                        ("h100-sxm-80gb=inf", "above 0 and below 1,000,000"),
                                        ("v100-sxm2-32gb=1", "not in --cluster")])
def test_bad_prices_are_one_line(price: str, word: str, capsys) -> None:
    code, _, err = run(JOB + ["--cluster", "a100-sxm4-80gb,h100-sxm-80gb", "--price", price],
                       capsys)
    assert code == 2 and "--price" in err and word in err and len(err.strip().splitlines()) == 1


def test_cost_across_types_needs_every_price(capsys) -> None:
    code, _, err = run(JOB + ["--cluster", "a100-sxm4-80gb,a100-sxm4-40gb"], capsys)
    assert code == 2 and "a100-sxm4-40gb has no price_per_gpu_hour" in err


def test_a_profile_price_is_checked() -> None:
    data = yaml.safe_load((Path(__file__).parents[2] / "profiles" / "h100-sxm-80gb.yaml")
                          .read_text())
    with pytest.raises(ConfigError, match="price_per_gpu_hour"):
        profile_from_dict({**data, "price_per_gpu_hour": -3})


V100 = ["search", "--model", "gpt3-13b", "--cluster", "v100-sxm2-32gb", "--num-gpus", "1",
        "--global-batch-size", "32"]


@pytest.mark.parametrize("runtime", [[], ["--runtime", "deepspeed"]])
def test_v100_default_space_runs_fp16_and_deepspeed_finds_zero_offload(runtime: list[str]
                                                                       ) -> None:
    res = run_search(build_request(build_parser().parse_args(V100 + runtime)))
    assert res.request.space.precision == (Precision.FP16,)  # auto: no bf16 on V100
    assert res.best is not None
    c = res.scored.cols
    zero_offload = res.scored.feasible & (c["zero_stage"] == 2) & c["offload_optimizer"] \
        & ~c["offload_params"]
    if runtime:  # ZeRO-Offload (Ren et al. 2021): 13B on one V100 with DeepSpeed
        assert zero_offload.any()
    else:  # autoplan's runtime keeps FSDP2's fp32 shards on the device (runtime/offload.py)
        assert not zero_offload.any()
        assert c["offload_params"][res.best] and c["zero_stage"][res.best] == 3
    assert np.isfinite(c["tokens_per_s"][res.best])


def test_auto_precision_per_device() -> None:
    from autoplan.search_space import load_space

    space = load_space("default")
    assert space.precision == ()
    pick = {name: space.for_device(load_profile(name).device.peak_flops_per_s,
                                   load_profile(name).host.compute_slots is not None).precision
            for name in ("v100-sxm2-32gb", "a100-sxm4-80gb", "h100-sxm-80gb", "cpu-gloo")}
    assert pick == {"v100-sxm2-32gb": (Precision.FP16,), "a100-sxm4-80gb": (Precision.BF16,),
                    "h100-sxm-80gb": (Precision.BF16, Precision.FP8),  # fp8 tensor cores
                    "cpu-gloo": (Precision.FP32,)}


def test_auto_precision_across_types_keeps_each_types_own_formats() -> None:
    """Listing an A100 beside an H100 took fp8 from both (the intersection): the cheapest plan
    overall cost a third more than the H100's own. Every type now searches the formats any of
    them picks, codes alike across types; the A100 cannot run fp8 (precision-unsupported)."""
    import dataclasses

    from autoplan.model_spec import load_model
    from autoplan.search.engine import GpuType, SearchRequest, type_requests
    from autoplan.search_space import load_space

    a100, h100 = load_profile("a100-sxm4-80gb"), load_profile("h100-sxm-80gb")
    req = SearchRequest(model=load_model("gpt3-13b"), model_ref="gpt3-13b", profile=a100,
                        profile_ref="a100-sxm4-80gb,h100-sxm-80gb", space=load_space("default"),
                        gpu_counts=(64,), global_batch_size=512,
                        types=(GpuType("a100-sxm4-80gb", a100, (64,)),
                               GpuType("h100-sxm-80gb", h100, (64,))))
    both = (Precision.BF16, Precision.FP8)
    assert [r.space.precision for r in type_requests(req)] == [both] * 2
    assert req.space.precision == both  # the codes the ranked rows are read back with
    assert "fp8" not in a100.device.peak_flops_per_s
    h200 = load_profile("h200-sxm-141gb")
    hoppers = dataclasses.replace(req, profile=h100, types=(
        req.types[1], GpuType("h200-sxm-141gb", h200, (64,))))
    assert {r.space.precision for r in type_requests(hoppers)} == {
        (Precision.BF16, Precision.FP8)}


def test_a_profile_given_by_path_is_priced_by_its_name_too(tmp_path) -> None:
    """`--cluster prof/noprice.yaml --price noprice=2` said "'noprice' is not in --cluster"."""
    from autoplan.search.request_args import gpu_types

    raw = yaml.safe_load((Path(__file__).parents[2] / "profiles" / "a100-sxm4-80gb.yaml")
                         .read_text())
    path = tmp_path / "noprice.yaml"
    path.write_text(yaml.safe_dump({**raw, "name": "noprice", "price_per_gpu_hour": None}))
    for given in ("noprice", str(path)):
        [a100, h100] = gpu_types(f"{path},h100-sxm-80gb", "8", f"{given}=2")
        assert a100.profile.price_per_gpu_hour == 2.0
        assert h100.profile.price_per_gpu_hour == load_profile("h100-sxm-80gb").price_per_gpu_hour
    with pytest.raises(ConfigError, match="'nope' is not in --cluster"):
        gpu_types(f"{path},h100-sxm-80gb", "8", "nope=2")


def test_a_cost_search_prints_each_types_dollars_not_its_tokens_per_s(tmp_path, capsys) -> None:
    """`--objective cost` without --train-tokens (user test 34, finding 8): the lines under the
    table showed tokens/s alone; they lead with the dollars and GPU-hours per 1e9 tokens the
    plans were ranked by."""
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(SMALL), encoding="utf-8")
    job = ["search", "--model", "gpt3-13b", "--num-gpus", "32", "--global-batch-size", "1024",
           "--objective", "cost", "--cluster", "h100-sxm-80gb,a100-sxm4-80gb",
           "--space", str(space)]
    code, text, err = run(job + ["--format", "table"], capsys)
    assert code == 0, err
    lines = text[text.index("best per GPU type (by cost):"):].splitlines()[1:4]
    code, out, _ = run(job + ["--format", "json"], capsys)
    rows = json.loads(out)["by_cluster"]
    for line, r in zip(lines, rows, strict=True):
        hours = r["num_gpus"] * 1e9 / r["tokens_per_s"] / 3600
        assert r["gpu_hours"] == pytest.approx(hours) and r["cost_tokens"] == 1e9
        assert r["usd"] == pytest.approx(hours * load_profile(r["cluster"]).price_per_gpu_hour)
        # the precision and its band, then the objective's figure first
        figures = line.split(f"cp=1, {r['precision']} (±{r['error_band']:.0%}), ", 1)[1]
        assert figures.startswith(f"${r['usd']:,.0f} per 1e9 tokens ({r['gpu_hours']:,.0f} GPU-h"
                                  if r["usd"] >= 100 else f"${r['usd']:.3g} per 1e9 tokens")
    assert min(rows[:2], key=lambda r: r["usd"])["cluster"] == rows[2]["cluster"]


BY_TYPE = {"cluster": "h100-sxm-80gb", "which": "h100-sxm-80gb", "feasible": True,
           "num_gpus": 64, "tokens_per_s": 95001.0, "step_s": 1.2345,
           "parallel": {"dp": 8, "tp": 8, "pp": 1, "cp": 1}}


@pytest.mark.parametrize("objectives,row,figures", [
    (["latency"], {}, "step 1.23 s, 95,001 tokens/s"),
    (["throughput"], {}, "95,001 tokens/s"),
    (["gpus"], {}, "95,001 tokens/s"),  # the count leads every line
    (["cost"], {"gpu_hours": 187.1, "cost_tokens": 1e9},  # a profile without a price
     "187 GPU-h per 1e9 tokens, 95,001 tokens/s"),
    (["cost"], {"gpu_hours": 0.5, "cost_tokens": 1e9, "usd": 0.734, "price_per_gpu_hour": 1.468},
     "$0.734 per 1e9 tokens (0.500 GPU-h at $1.47/GPU-h), 95,001 tokens/s"),
    (["cost"], {"gpu_hours": 7363.0, "cost_tokens": 3e11, "usd": 22089.0, "days": 9.61,
                "price_per_gpu_hour": 3.0},
     "$22,089 (7,363 GPU-h at $3.00/GPU-h), 9.6 days, 95,001 tokens/s"),
    (["latency", "cost"], {"gpu_hours": 187.1, "cost_tokens": 1e9},
     "step 1.23 s, 95,001 tokens/s, 187 GPU-h per 1e9 tokens"),
])
def test_the_per_type_line_leads_with_the_first_objectives_figure(
        objectives: list[str], row: dict[str, Any], figures: str) -> None:
    from autoplan.search.summary import by_cluster_lines

    header, line = by_cluster_lines([BY_TYPE | row], objectives)
    assert header == f"best per GPU type (by {objectives[0]}" + (
        ", the first objective):" if len(objectives) > 1 else "):")
    assert line == f"  h100-sxm-80gb: 64 GPUs, dp=8 tp=8 pp=1 cp=1, {figures}"
