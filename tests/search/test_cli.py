"""`autoplan search` through the real command line: outputs, files, exit codes, and the
acceptance search (gpt3-175b on 1024 A100-80GB)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.plan import Offload, Recompute, RecomputePolicy
from autoplan.plan_files import load_plan

SMALL = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
         "--global-batch-size", "8", "--space", "small-cpu"]
ACCEPT = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
          "--global-batch-size", "1536"]


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_is_one_object_with_counts(capsys) -> None:
    code, out, _ = run(SMALL + ["--format", "json", "--top", "3"], capsys)
    data = json.loads(out)
    assert code == 0 and data["feasible"] and data["sampler"] == "exhaustive"
    assert sum(data["counts"].values()) == data["candidates"]
    assert len(data["top"]) == 3
    assert data["top"][0]["tokens_per_s"] >= data["top"][1]["tokens_per_s"]


def test_yaml_and_table_formats(capsys) -> None:
    code, out, _ = run(SMALL + ["--format", "yaml", "--top", "2"], capsys)
    assert code == 0 and yaml.safe_load(out)["feasible"]
    code, out, _ = run(SMALL + ["--format", "table", "--top", "2"], capsys)
    # the throughput column: "tokens/s" wide, "tok/s" in 80 columns
    assert code == 0 and "top 2 plans by throughput" in out
    assert any(header in out for header in ("tokens/s", "tok/s"))


def test_out_dir_files_load_and_refuse_overwrite(tmp_path: Path, capsys) -> None:
    out = tmp_path / "res"
    code, _, _ = run(SMALL + ["--out", str(out), "--format", "json", "--top", "4"], capsys)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["plan.yaml", "summary.json", "top.yaml",
                                                     "trials.csv.gz"]
    plan = load_plan(out / "plan.yaml")
    assert estimate_plan(plan).feasible
    assert len(yaml.safe_load((out / "top.yaml").read_text())["plans"]) == 4
    code, out_json, _ = run(["estimate", "--plan", str(out / "plan.yaml"), "--format", "json"],
                            capsys)
    assert code == 0 and json.loads(out_json)["feasible"]
    before = (out / "plan.yaml").read_text()
    code, _, err = run(SMALL + ["--out", str(out), "--format", "json", "--objective", "latency"],
                       capsys)
    assert code == 2 and "--force" in err and (out / "plan.yaml").read_text() == before
    code, _, _ = run(SMALL + ["--out", str(out), "--format", "json", "--force"], capsys)
    assert code == 0 and not list(tmp_path.glob(".res.*"))


def test_a_large_trials_csv_says_it_is_being_written(tmp_path: Path, capsys,
                                                     monkeypatch) -> None:
    """A 3.6M-row trials.csv.gz took minutes after "done", in silence; from LARGE_CSV_ROWS rows
    search says what it is writing (and the CSV still reads back whole)."""
    import gzip

    from autoplan.search import output

    monkeypatch.setattr(output, "LARGE_CSV_ROWS", 1)
    code, _, err = run(SMALL + ["--out", str(tmp_path / "r"), "--format", "json"], capsys)
    assert code == 0
    rows = len(gzip.decompress((tmp_path / "r" / "trials.csv.gz").read_bytes()).splitlines())
    assert f"search: writing {rows - 1:,} rows to trials.csv.gz" in err
    monkeypatch.setattr(output, "LARGE_CSV_ROWS", rows)
    code, _, err = run(SMALL + ["--out", str(tmp_path / "s"), "--format", "json"], capsys)
    assert code == 0 and "writing" not in err


def test_infeasible_exits_3_with_shortfall(capsys) -> None:
    code, out, err = run(["search", "--model", "gpt3-13b", "--cluster", "cpu-gloo",
                          "--num-gpus", "4", "--global-batch-size", "8", "--space", "small-cpu",
                          "--format", "json"], capsys)
    assert code == 3
    assert len(err.strip().splitlines()) == 1
    assert "out-of-memory" in err and "needs" in err and "GiB" in err
    data = json.loads(out)
    assert not data["feasible"] and data["nearest"]["misses"]


def test_impossible_target_exits_3(capsys) -> None:
    code, _, err = run(SMALL + ["--format", "json", "--max-step-time-s", "1e-9"], capsys)
    assert code == 3 and "step-time" in err and "per step of at most" in err


@pytest.mark.parametrize("extra,field", [
    (["--objective", "speed"], "--objective"),
    (["--num-gpus", "8..4"], "--num-gpus"),
    (["--deadline-days", "3"], "--deadline-days"),
    (["--sampler", "exhaustive", "--storage", "sqlite:///x.db", "--study", "s"], "--storage"),
    (["--min-tokens-per-s", "-5"], "--min-tokens-per-s"),
    (["--memory-slack", "p90"], "--memory-slack"),
])
def test_bad_flags_exit_2(extra: list[str], field: str, capsys) -> None:
    try:
        code, _, err = run(SMALL + ["--format", "json"] + extra, capsys)
    except SystemExit as exit_:  # a value the flag's type refuses (cli_common): argparse's exit
        code, err = exit_.code, capsys.readouterr().err
    assert code == 2 and field in err and len(err.strip().splitlines()) == 1


def test_report_writes_plots(tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")
    code, _, _ = run(SMALL + ["--format", "json", "--report", str(tmp_path / "r")], capsys)
    assert code == 0
    # one self-contained page: the figures are inline (tests/search/test_report.py)
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["report.html"]
    assert "data:image/png;base64," in (tmp_path / "r" / "report.html").read_text()


def test_acceptance_search_winner_fits_and_memory_savings_pay(tmp_path: Path, capsys) -> None:
    code, out, _ = run(ACCEPT + ["--format", "json", "--out", str(tmp_path / "a")], capsys)
    data = json.loads(out)
    assert code == 0 and data["sampler"] == "exhaustive" and data["scored"] >= 100_000
    plan = load_plan(tmp_path / "a" / "plan.yaml")
    est = estimate_plan(plan)
    assert est.feasible
    # every memory saving the winner uses pays: without it the plan is slower or does not fit
    savings = []
    if plan.sequence_parallel:
        savings.append(plan.replace(sequence_parallel=False))
    if plan.recompute.policy is not RecomputePolicy.NONE:
        savings.append(plan.replace(recompute=Recompute()))
    if plan.offload.optimizer or plan.offload.params:
        savings.append(plan.replace(offload=Offload()))
    if plan.zero_stage > 0:
        savings.append(plan.replace(zero_stage=0, offload=Offload()))
    for alt in savings:
        other = estimate_plan(alt)
        assert not other.feasible or other.tokens_per_s <= est.tokens_per_s


def test_memory_slack_p75_keeps_only_plans_that_fit_at_the_75th_percentile(capsys) -> None:
    """The acceptance search's winner fills memory to within the allocator's 75th-percentile
    slack of the GPU (mem_tight_gib > 0, GiB! in the table); --memory-slack p75 asks every plan
    to fit with that slack, so none is tight and fewer are feasible."""
    code, out, _ = run(ACCEPT + ["--format", "json", "--top", "3"], capsys)
    median = json.loads(out)
    assert code == 0 and median["top"][0]["mem_tight_gib"] > 0
    code, out, _ = run(ACCEPT + ["--format", "json", "--top", "3", "--memory-slack", "p75"],
                       capsys)
    p75 = json.loads(out)
    assert code == 0 and all(r["mem_tight_gib"] == 0 for r in p75["top"])
    assert p75["counts"]["feasible"] < median["counts"]["feasible"]
    assert p75["top"][0]["mem_gib"] < median["top"][0]["mem_gib"]
    assert p75["top"][0]["tokens_per_s"] <= median["top"][0]["tokens_per_s"]


def test_the_search_names_the_runtime_it_priced(capsys) -> None:
    """Every estimate says which runtime it priced: the search's JSON at its top level and the
    table's header line, the default (autoplan's own runtime on the device) included."""
    code, out, _ = run(SMALL + ["--format", "json", "--top", "1"], capsys)
    assert code == 0 and json.loads(out)["runtime"] == "autoplan-cpu"
    code, out, _ = run(ACCEPT + ["--runtime", "megatron", "--format", "table", "--top", "1"],
                       capsys)
    assert code == 0 and "priced for runtime megatron" in " ".join(out.split())
