"""`autoplan tune` refuses bad input before any trial runs (one line, exit 2): non-finite
budgets, a --storage file that is not a journal, an --out that is a file; says what came
closest when nothing is feasible (exit 3); and writes its result files whole or not at all."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import yaml

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan import plan_from_dict
from autoplan.tune.cli import OUT_FILES, _write_out

TUNE = ["tune", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
        "--global-batch-size", "2"]


def _fails(capsys, argv: list[str], code: int, *needles: str) -> None:
    try:  # a value that is no number is argparse's refusal (SystemExit), a range the check's
        got = main(argv)
    except SystemExit as exit_:
        got = exit_.code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert got == code, err
    assert len(err.splitlines()) == 1 and not captured.out, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize(("flag", "value"), [
    ("--budget-s", "nan"), ("--budget-s", "inf"), ("--trial-timeout-s", "nan"),
    ("--prune-ratio", "nan"), ("--prune-ratio", "inf"),
])
def test_non_finite_budgets_are_refused(capsys, flag: str, value: str) -> None:
    _fails(capsys, [*TUNE, flag, value, "--dry-run"], 2, f"{flag}: got {value!r}")


def test_a_storage_file_that_is_not_a_journal_is_refused_and_left_alone(tmp_path: Path,
                                                                        capsys) -> None:
    log = tmp_path / "tune.log"
    log.write_text("garbage\n")
    _fails(capsys, [*TUNE, "--storage", f"journal:{log}", "--study", "s"], 2,
           "--storage", "not an Optuna journal")
    assert log.read_text() == "garbage\n"


@pytest.mark.parametrize(("url", "why"), [("foo://bar", "NoSuchModuleError"),
                                         ("notaurl", "ArgumentError")])
def test_a_dry_run_refuses_a_storage_url_the_tune_cannot_open(capsys, url: str,
                                                              why: str) -> None:
    """A dry run opens no storage, so it printed its trials for any --storage URL."""
    _fails(capsys, [*TUNE, "--dry-run", "--storage", url, "--study", "s"], 2,
           f"--storage: got {url!r}, which is no storage URL ({why})", "journal:PATH")


def test_an_out_that_is_a_file_is_refused_before_any_trial(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    _fails(capsys, [*TUNE, "--out", str(afile)], 2, "--out", "is a file")
    assert afile.read_text() == "mine"


def test_an_out_holding_results_needs_force(tmp_path: Path, capsys) -> None:
    (tmp_path / "summary.json").write_text("{}")
    _fails(capsys, [*TUNE, "--out", str(tmp_path)], 2, "already holds summary.json",
           "--force")


def test_nothing_feasible_names_the_nearest_miss(capsys) -> None:
    _fails(capsys, ["tune", "--model", "gpt3-1.3b", "--cluster", "cpu-gloo", "--num-gpus", "1",
                    "--global-batch-size", "2", "--dry-run"], 3,
           "no feasible plan among", "nearest (out-of-memory)", "GiB of 4.0 GiB per GPU")


def test_result_files_are_written_whole_or_not_at_all(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "trials").mkdir(parents=True)  # the tune's own work stays beside the results
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 1}})
    rows = [{"key": "a", "status": "complete"}]
    circular: dict = {}
    circular["self"] = circular  # summary.json cannot be written: after plan.yaml was, before
    with pytest.raises((ValueError, RecursionError)):
        _write_out(out, circular, rows, plan, force=False)
    assert sorted(p.name for p in out.iterdir()) == ["trials"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    _write_out(out, {"trials": rows}, rows, plan, force=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([*OUT_FILES, "trials"])


def _plan_file(tmp_path: Path, name: str = "p.yaml", **fields) -> Path:
    data = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
            "batch": {"micro_batch_size": 1, "global_batch_size": 2}, "precision": "fp32",
            **fields}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("fields", "flags", "needles"), [
    ({"batch": {"micro_batch_size": 1, "global_batch_size": 1}}, [],
     ["batch.global_batch_size 1, but this tune has --global-batch-size 2"]),
    ({"model": "tiny-llama"}, [], ["model tiny-llama, but this tune has --model tiny"]),
    ({}, ["--seq-len", "32"], ["seq_len 64, but this tune has --seq-len 32"]),
    ({"parallel": {"dp": 2}, "cluster": {"profile": "cpu-gloo", "num_gpus": 2}}, [],
     ["ranks 2, but this tune has --num-gpus 1"]),
    ({"cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 1}}, [],
     ["cluster.profile a100-sxm4-80gb, but this tune has --cluster cpu-gloo"]),
])
def test_a_plan_for_another_request_is_refused(tmp_path: Path, capsys, fields, flags,
                                               needles) -> None:
    """Trials compare tokens per second only between plans training the same tokens per
    step: a --plan for another batch, model or sequence length would win on a short step."""
    plan = _plan_file(tmp_path, **fields)
    _fails(capsys, [*TUNE, *flags, "--plan", str(plan), "--dry-run"], 2,
           f"--plan: {plan}", *needles)


@pytest.mark.parametrize("profile", ["cpu-gloo", str(Path(__file__).parents[3] / "profiles"
                                                       / "cpu-gloo.yaml")])
def test_a_plan_for_this_request_is_run(tmp_path: Path, capsys, profile) -> None:
    """The plan may name its profile by path where the tune names it (or the other way)."""
    plan = _plan_file(tmp_path, cluster={"profile": profile, "num_gpus": 1})
    assert main([*TUNE, "--plan", str(plan), "--dry-run", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["trials"]
    assert [r["source"] for r in rows].count("user") == 1


def test_a_plan_train_would_refuse_is_refused_before_any_trial(tmp_path: Path, capsys) -> None:
    """An fp8 plan on a CPU was shown in the dry run and spent a trial failing."""
    plan = _plan_file(tmp_path, precision="fp8")
    _fails(capsys, [*TUNE, "--plan", str(plan), "--dry-run"], 2,
           f"--plan: {plan} cannot train here: ", "fp8", "fix the plan, or tune without it")


def test_a_plan_that_cannot_be_read_names_the_flag(tmp_path: Path, capsys) -> None:
    _fails(capsys, [*TUNE, "--plan", str(tmp_path / "nope.yaml"), "--dry-run"], 2,
           "autoplan tune: error: --plan: no such file")
    bad = _plan_file(tmp_path, zero_stage=7)
    _fails(capsys, [*TUNE, "--plan", str(bad), "--dry-run"], 2, f"--plan {bad}: zero_stage")


FAKE_TRAIN = ("import json, sys\n"
              "with open(sys.argv[1], 'w') as fh:\n"
              "    for step in range(1, int(sys.argv[2]) + 1):\n"
              "        fh.write(json.dumps({'step': step, 'step_time_s': 0.01}) + '\\n')\n")


def test_trial_runs_without_out_go_to_a_temporary_directory_removed_after(
        tmp_path: Path, capsys, monkeypatch) -> None:
    plans: list[Path] = []

    def fake(plan_path: Path, nproc: int, steps: int, metrics: Path) -> list[str]:
        plans.append(plan_path)
        return [sys.executable, "-c", FAKE_TRAIN, str(metrics), str(steps)]

    monkeypatch.setattr("autoplan.tune.runner.train_command", fake)
    monkeypatch.chdir(tmp_path)
    assert main([*TUNE, "--top", "1", "--steps", "3", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [t["status"] for t in data["trials"]] == ["complete"]
    assert len(plans) == 1
    workdir = plans[0].parents[2]  # WORKDIR/trials/KEY/plan.yaml
    assert workdir != tmp_path and not workdir.exists()
    assert list(tmp_path.iterdir()) == []  # nothing left in the working directory


def test_only_the_picked_rows_become_plans(monkeypatch) -> None:
    """--top plans, the best of each layout first, built without a Plan per feasible row."""
    import autoplan.search.output as output
    from autoplan.tune.candidates import search_candidates

    args = argparse.Namespace(model="tiny", cluster="cpu-gloo", num_gpus=2,
                              global_batch_size=8, seq_len=None, space="small-cpu", top=6)
    built: list[int] = []
    every: list = []
    original = output.plans

    def counting(result, rows):
        built.append(len(rows))
        every.append(result)
        return original(result, rows)

    monkeypatch.setattr(output, "plans", counting)
    got = search_candidates(args)
    assert sum(built) == 6 and len(got) == 6
    # the same picks as building every ranked plan and keeping the first of each layout
    result = every[0]
    firsts, rest, seen = [], [], set()
    for rank, p in enumerate(original(result, result.order), 1):
        layout = (p.parallel, p.batch.micro_batch_size, p.pipeline.schedule, p.pipeline.vpp)
        (rest if layout in seen else firsts).append((p, f"model rank {rank}"))
        seen.add(layout)
    assert len(result.order) > 100  # many rows, few of them built
    assert got == (firsts + rest)[:6]


def test_picked_ranks_take_each_layout_first_then_the_rest_in_rank_order() -> None:
    import numpy as np

    from autoplan.tune.candidates import picked_ranks

    cols = {"dp": np.array([2, 1, 1, 1, 1]), "tp": np.ones(5, dtype=np.int64),
            "mbs": np.array([1, 2, 1, 1, 2]), "zero_stage": np.arange(5)}
    order = np.array([1, 2, 3, 4, 0])  # best first: rows 1 and 4 share a layout, 2 and 3 too
    assert picked_ranks(cols, order, 4).tolist() == [0, 1, 4, 2]
    assert picked_ranks(cols, order, 2).tolist() == [0, 1]
    assert picked_ranks(cols, order, 9).tolist() == [0, 1, 4, 2, 3]


@pytest.mark.parametrize(("here", "cluster", "refused"), [
    ("cpu", "a100-sxm4-80gb", True), ("NVIDIA H100 80GB HBM3", "a100-sxm4-80gb", True),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb", False), ("cpu", "cpu-gloo", False),
])
def test_tune_measures_only_the_device_its_profile_describes(monkeypatch, capsys, here: str,
                                                             cluster: str, refused: bool) -> None:
    """tune calibrates --cluster on runs of this machine: a GPU profile fitted to CPU runs (or
    an A100's to an H100's) would be fitted to the wrong hardware, so it is refused up front."""
    import autoplan.runtime.machine as machine

    monkeypatch.setattr(machine, "local_device", lambda: here)
    argv = ["tune", "--model", "tiny", "--cluster", cluster, "--num-gpus", "1",
            "--global-batch-size", "2", "--dry-run", "--format", "json"]
    if refused:
        _fails(capsys, argv, 2, f"--cluster: profile '{cluster}' describes a100",
               f"this machine trains on {here}")
    else:
        assert main(argv) == 0, capsys.readouterr().err


def test_a_tune_run_record_says_what_it_trained_on(tmp_path: Path) -> None:
    """The record carries machine.device, so `autoplan calibrate` refuses to fit it to a
    profile of another device."""
    from autoplan.calibrate import check_runs, load_run
    from autoplan.hardware import load_profile
    from autoplan.tune.study import Candidate, run_record

    cand = Candidate(plan=plan_from_dict(yaml.safe_load(_plan_file(tmp_path).read_text())),
                     key="k", predicted_step_s=1.0, predicted_memory_bytes=1e9,
                     source="user", tokens_per_step=128)
    rec = run_record(cand, {"measured_step_s": 1.5, "peak_memory_bytes": 2e9, "steps_run": 5},
                     "cpu-gloo", "cpu")
    assert rec["machine"] == {"device": "cpu"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(rec))
    run = load_run(path)
    check_runs([run], "cpu-gloo", load_profile("cpu-gloo"))
    with pytest.raises(ConfigError, match="machine.device"):
        check_runs([run], "a100-sxm4-80gb", load_profile("a100-sxm4-80gb"))


def test_a_dry_run_over_budget_says_how_many_trials_fit(capsys) -> None:
    """`--budget-s 1` printed "predicted total 28 s of a 1 s budget" and nothing on what then
    happens: tune runs the best predicted first until the budget is spent."""
    assert main([*TUNE, "--dry-run", "--format", "json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    times = [r["predicted_trial_s"] for r in dry["trials"]]
    budget = times[0] + 0.5 * times[1]  # the first fits, the second does not
    assert main([*TUNE, "--dry-run", "--budget-s", str(budget), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["predicted_within_budget"] == 1
    assert main([*TUNE, "--dry-run", "--budget-s", str(budget), "--format", "table"]) == 0
    assert f"about 1 of {len(times)} trials fit" in " ".join(capsys.readouterr().out.split())
