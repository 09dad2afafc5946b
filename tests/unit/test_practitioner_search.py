"""Issue #12, Acceptance 1, on small scenarios of the practitioner set: the default-space search
under the runtime the practitioners used finds a winner predicted at least as fast as their own
plan (priced for the same runtime), and that winner exports to the runtime's target.

benchmarks/practitioner_search.py prints the whole set; these run the scenarios that take about
a second each. A scenario where the acceptance does not hold yet is an expected failure with its
reason, strict, so the mark has to go when it is fixed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark_scripts import load_script


def _bench():
    return load_script("practitioner_search")


def _entry(bench, scenario: str):
    return next(e for e in bench.load_data(bench.DEFAULT_DATA) if e["id"] == scenario)


@pytest.mark.parametrize("scenario", [
    pytest.param(
        "zero-offload-10b-1v100",  # deepspeed, one V100, fp16
        marks=pytest.mark.xfail(strict=True, reason=(
            "the default space's micro-batch sizes (1, 2, 4, 8) do not hold the 10 the run "
            "used (batch 10 on one GPU: 1, 2, 5 or 10); priced with each GEMM's tile/wave "
            "quantization in full, its best in-space plan (micro-batch 1, no recompute, "
            "15.71 s) is 3% slower than theirs (15.24 s), and micro-batch 5 or 10 with flash "
            "attention would beat it (13.1-13.9 s)"))),
    "nemo-llama31-8b-128gpu-bf16",  # megatron, 128 H100
    "torchtitan-llama31-8b-128gpu-fsdp",  # torchtitan, 128 H100
    # torchtitan offloads parameters and optimizer together only (RuntimeTraits.offload): its
    # search no longer returns parameter-only offload, which its export refuses
    "torchtitan-llama31-8b-8gpu-fsdp",
])
def test_winner_is_as_fast_as_the_practitioners_plan_and_exports(scenario: str) -> None:
    bench = _bench()
    entry = _entry(bench, scenario)
    outcome = bench.score_scenario(entry)
    row = outcome.row
    assert outcome.winner is not None, row["exports"]
    assert outcome.winner.predicted["runtime"] == entry["runtime"]
    assert row["estimate_agrees"]  # `estimate` prices the winner as the search did
    assert row["ours_pred_s"] <= row["theirs_pred_s"] * (1 + 1e-9), row
    assert row["exports"].startswith("yes"), row["exports"]
    # the scenario's numerics stay theirs: a BF16 run is searched in BF16, not FP8
    assert outcome.winner.precision == bench.build(entry)[0].precision


def test_json_output_is_never_overwritten(tmp_path: Path, capsys) -> None:
    bench = _bench()
    out = tmp_path / "rows.json"
    out.write_text("keep\n")
    code = bench.main(["--only", "zero-offload-10b-1v100", "--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--json" in err and out.read_text() == "keep\n"


def test_json_rows_follow_the_table(tmp_path: Path, capsys) -> None:
    import json

    bench = _bench()
    out = tmp_path / "rows.json"
    assert bench.main(["--only", "zero-offload-10b-1v100", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    (row,) = json.loads(out.read_text())["scenarios"]
    assert row["id"] == "zero-offload-10b-1v100" and row["id"] in text
    assert row["winner"] in " ".join(text.split())  # the layout the table prints
    # their plan's measured MFU: the cost model's FLOPs over the published step, one V100's
    # fp16 peak (what the winner's MFU is set against for issue #11's 55% check)
    plan, model, cluster = bench.build(_entry(bench, "zero-offload-10b-1v100"))
    flops = bench.estimate_plan(plan, cluster, model).model_flops_per_step
    assert row["theirs_measured_mfu"] == pytest.approx(flops / (21.79 * 125e12))


def test_unknown_scenario_is_one_line_exit_2(capsys) -> None:
    bench = _bench()
    assert bench.main(["--only", "no-such-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-run" in err[0]


def test_walk_turns_their_plan_into_the_winner_one_knob_group_at_a_time() -> None:
    from dataclasses import replace

    from autoplan.plan import Attention, Pipeline, Recompute, RecomputePolicy, Schedule

    bench = _bench()
    entry = _entry(bench, "nemo-gpt3-175b-1024a100-tp8-pp8-sp-selective")
    theirs, model, cluster = bench.build(entry)
    traits = bench.row_runtime(entry)
    # a winner that differs in three groups: attention, recompute and the schedule (its layout
    # is theirs, so the schedule is a plan on its own)
    winner = replace(theirs, attention=Attention.FLASH,
                     recompute=Recompute(policy=RecomputePolicy.NONE),
                     pipeline=Pipeline(schedule=Schedule.INTERLEAVED_1F1B, vpp=2))
    steps = bench.walk(theirs, winner, cluster, model, traits)
    assert [s["step"] for s in steps] == ["their plan", "attention kernel", "recompute",
                                          "pipeline schedule"]
    end = bench.estimate_plan(winner, cluster, model, runtime=traits)
    assert steps[-1]["mfu"] == pytest.approx(end.mfu)  # the walk ends at the winner
    start = bench.estimate_plan(theirs, cluster, model, runtime=traits)
    assert steps[0]["step_s"] == pytest.approx(start.step_time_s)
    assert "eager-attention" in steps[0]["knobs"] and "eager-attention" not in steps[1]["knobs"]
    # a plan walked to itself has no steps but its own
    assert [s["step"] for s in bench.walk(theirs, theirs, cluster, model, traits)] == [
        "their plan"]


def test_a_torchtitan_plan_exports_in_the_format_of_the_release_that_priced_it() -> None:
    """The `torchtitan` traits are the 0.2-era release the published runs used: its plans
    export as TOML, which checkpoints every n-th block (one block of 32 here); the Python
    config of 0.3 cannot say that, and the check does not fall back on another release."""
    from dataclasses import replace

    from autoplan.plan import Recompute, RecomputePolicy

    bench = _bench()
    plan, _, _ = bench.build(_entry(bench, "torchtitan-llama3-8b-64a100-fsdp-sel-layer"))
    # llama-3.1-8b: torchtitan's 8B flavor rotates with Llama 3.1's RoPE scaling, so only the
    # Python config can define that 2024 run's llama-3-8b (export/torchtitan.py)
    plan = replace(plan, model="llama-3.1-8b", zero_stage=2, recompute=replace(
        plan.recompute, policy=RecomputePolicy.FULL, num_layers=1))
    assert isinstance(plan.recompute, Recompute)
    assert bench.export_check(plan, "torchtitan", 8).endswith(", toml)")
    assert bench.export_check(plan, "torchtitan-0.3", 8).startswith("refused: ")
