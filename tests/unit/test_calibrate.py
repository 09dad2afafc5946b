"""Calibration recovers a profile that explains the runs, and never ends worse than it began."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoplan.calibrate import apply_factors, calibrate, identity, load_run
from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict
from autoplan.plan_files import plan_to_dict
from tests.cli_refusals import assert_refused

PLANS = [
    {"parallel": {"dp": 2}}, {"parallel": {"tp": 2}, "sequence_parallel": True},
    {"parallel": {"pp": 2}}, {"parallel": {"dp": 4}, "zero_stage": 3},
    {"parallel": {"dp": 2, "tp": 2}}, {"parallel": {"dp": 1}},
    {"parallel": {"dp": 2}, "recompute": {"policy": "full"}},
    {"parallel": {"dp": 4}, "batch": {"micro_batch_size": 4, "global_batch_size": 32}},
]


def _runs(tmp_path, truth):
    paths = []
    for i, extra in enumerate(PLANS):
        par = extra["parallel"]
        n = par.get("dp", 1) * par.get("tp", 1) * par.get("pp", 1)
        plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": n},
                               "precision": "fp32", "attention": "eager",
                               "batch": {"micro_batch_size": 2, "global_batch_size": 16},
                               **extra})
        est = estimate_plan(plan, ClusterSpec(truth, n))
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"plan": plan_to_dict(plan), "profile": "cpu-gloo",
                                    "measured": {"step_time_s": est.step_time_s,
                                                 "peak_memory_bytes": est.memory_total_bytes}}))
        paths.append(path)
    return paths


def test_calibration_recovers_a_hidden_profile(tmp_path) -> None:
    base = load_profile("cpu-gloo")
    hidden = dict(identity(base), compute=0.4, op_overhead_s=2.5e-5, collective_tables=3.0)
    truth = apply_factors(base, hidden)
    truth = dataclasses.replace(
        truth, device=dataclasses.replace(truth.device, reserved_bytes=500 * 2**20))
    runs = [load_run(p) for p in _runs(tmp_path, truth)]
    result = calibrate(runs, base, trials=200, seed=0)
    s = result.summary()
    assert s["step_time_mape_before"] > 0.3
    assert s["step_time_mape_after"] < 0.05
    assert s["memory_mape_after"] < s["memory_mape_before"]
    assert result.profile.device.reserved_bytes == pytest.approx(500 * 2**20, rel=0.02)


def test_calibrate_cli_writes_a_loadable_profile(tmp_path, capsys) -> None:
    base = load_profile("cpu-gloo")
    truth = apply_factors(base, dict(identity(base), compute=0.5))
    paths = _runs(tmp_path, truth)
    out = tmp_path / "fitted.yaml"
    code = main(["calibrate", *map(str, paths), "--profile", "cpu-gloo", "--out", str(out),
                 "--trials", "60", "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["step_time_mape_after"] <= data["step_time_mape_before"]
    fitted = load_profile(out)
    assert fitted.measured["calibration"]["runs"] == len(PLANS)
    assert main(["calibrate", str(paths[0]), "--profile", "cpu-gloo", "--out", str(out)]) == 2


def test_mfu_on_a_calibrated_profile_is_against_the_device_s_own_peak(tmp_path, capsys) -> None:
    """calibrate folds its compute factor into the peak; MFU divided by that fitted peak rose
    when the plan was priced slower (7.0% -> 15.9% in a user's test). MFU stays model FLOPs
    over the device's own peak and the priced time, and `clusters` lists that peak."""
    base = load_profile("cpu-gloo")
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", *map(str, _runs(tmp_path, apply_factors(
        base, dict(identity(base), compute=0.4)))), "--profile", "cpu-gloo",
                 "--out", str(out), "--trials", "60", "--format", "json"]) == 0
    capsys.readouterr()
    fitted = load_profile(out)
    factor = fitted.calibrated_compute
    assert factor == fitted.measured["calibration"]["factors"]["compute"] and factor < 0.8
    assert fitted.device.peak("fp32") == pytest.approx(base.device.peak("fp32") * factor)
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
                           "precision": "fp32", "parallel": {"dp": 2},
                           "batch": {"micro_batch_size": 2, "global_batch_size": 16}})
    before, after = (estimate_plan(plan, ClusterSpec(p, 2)) for p in (base, fitted))
    assert after.step_time_s > before.step_time_s and after.mfu < before.mfu
    assert after.mfu == pytest.approx(before.mfu * before.step_time_s / after.step_time_s)
    # `clusters` lists the device's own peak and says the profile is calibrated
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "fitted.yaml").write_text(out.read_text())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOPLAN_PROFILES", str(profiles))
        assert main(["clusters", "--format", "json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "fitted")
    assert row["calibrated"] and row["peak_tflops"]["fp32"] == pytest.approx(
        base.device.peak("fp32") / 1e12)
    # calibrated again from the calibrated profile: the multiplier spans both fits
    again = tmp_path / "again.yaml"
    assert main(["calibrate", *map(str, _runs(tmp_path, apply_factors(
        base, dict(identity(base), compute=0.2)))), "--profile", str(out),
                 "--out", str(again), "--trials", "60", "--format", "json"]) == 0
    capsys.readouterr()
    twice = load_profile(again)
    assert twice.device.peak("fp32") / base.device.peak("fp32") == pytest.approx(
        twice.calibrated_compute)
    assert twice.calibrated_compute != twice.measured["calibration"]["factors"]["compute"]


def test_one_plan_fits_one_factor_the_one_that_governs_most_of_its_step(tmp_path,
                                                                         capsys) -> None:
    """One run record fitted 6 factors (compute 0.131, memory_bandwidth 9.51, ...), printed
    '36.3% -> 0.0%' and wrote a profile that priced other plans worse than the one it started
    from. One plan's runs tell one ratio, measured / predicted: the fit sets one factor, the one
    that governs the largest share of the predicted step time, and leaves every other."""
    base = load_profile("cpu-gloo")
    paths = _runs(tmp_path, apply_factors(base, dict(identity(base), compute=0.5)))
    twice = [paths[0], tmp_path / "again.json"]  # two records of one plan: one plan
    twice[1].write_text(paths[0].read_text())
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", *map(str, twice), "--profile", "cpu-gloo", "--out", str(out),
                 "--trials", "20", "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    shares = data["factor_shares"]
    assert data["distinct_plans"] == 1 and len(shares) > 1
    assert data["factors_fitted"] == [max(shares, key=shares.get)]
    assert sorted(data["factors_unidentified"]) == sorted(set(shares) - {
        data["factors_fitted"][0]})
    # factors are ratios after / before: 1 for each left as it was; values only the fitted
    assert all(data["factors"][name] == 1.0 for name in data["factors_unidentified"])
    assert set(data["values"]) - {"reserved_bytes"} == set(data["factors_fitted"])
    assert data["step_time_mape_after"] < 0.01 and data["step_time_mape_held_out"] is None
    assert [r["error_held_out"] for r in data["per_run"]] == [None, None]
    assert [line for line in captured.err.splitlines() if "fitted to alone" in line] == [
        "autoplan calibrate: warning: the error after is measured on the runs it was fitted to "
        "alone, and says little of other plans: with 3 or more different plans each is also "
        "predicted by a fit to the others"]
    # as many different plans as factors: all fitted, and each plan held out once
    out2 = tmp_path / "fitted2.yaml"
    assert main(["calibrate", *map(str, paths), "--profile", "cpu-gloo", "--out", str(out2),
                 "--trials", "20", "--format", "json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["distinct_plans"] == len(PLANS) and data["factors_unidentified"] == []
    assert data["step_time_mape_held_out"] is not None
    assert "fitted to alone" not in captured.err


def test_bad_run_records(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"plan": {}, "measured": {"step_time_s": 1.0}}))
    with pytest.raises(ConfigError):
        load_run(bad)
    bad.write_text(json.dumps({"measured": {"step_time_s": 1.0}}))
    with pytest.raises(ConfigError, match="plan"):
        load_run(bad)
    bad.write_text(json.dumps({"plan": {}, "measured": {"step_time_s": -1}, "extra": 1}))
    with pytest.raises(ConfigError, match="unknown key"):
        load_run(bad)


def test_only_factors_a_profile_can_feel_are_fitted() -> None:
    from autoplan.calibrate import active_factors

    gpu, cpu = load_profile("h100-sxm-80gb"), load_profile("cpu-gloo")
    assert {"collective_tables", "host_overheads"}.isdisjoint(active_factors(gpu))
    assert {"collective_tables", "host_overheads"} <= set(active_factors(cpu))
    scaled = apply_factors(cpu, dict(identity(cpu), collective_tables=2.0, host_overheads=3.0))
    assert scaled.collectives.all_reduce[2].y[0] == pytest.approx(
        2.0 * cpu.collectives.all_reduce[2].y[0])
    assert scaled.efficiency.fsdp_unit_overhead_s == pytest.approx(
        3.0 * cpu.efficiency.fsdp_unit_overhead_s)
    assert scaled.efficiency.op_overhead_s == cpu.efficiency.op_overhead_s  # fitted on its own


def test_calibrate_writes_under_the_name_given_into_the_user_directory(tmp_path, monkeypatch,
                                                                       capsys) -> None:
    """#14 item 2, #16 item 2: a name resolves from the user's directory, the result is named
    after it, and a profile's inner `name:` never decides where the file goes."""
    import yaml

    from autoplan.hardware import PROFILES_DIR

    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(user))
    raw = yaml.safe_load((PROFILES_DIR / "cpu-gloo.yaml").read_text())
    (user / "my-machine.yaml").write_text(yaml.safe_dump({**raw, "name": "../../escaped"}))
    run = _runs(tmp_path, load_profile("cpu-gloo"))[0]
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", str(run), "--profile", "my-machine", "--trials", "3",
                 "--format", "json"]) == 0
    written = json.loads(capsys.readouterr().out)["profile"]
    assert written == str(user / "my-machine-calibrated.yaml")
    assert load_profile("my-machine-calibrated").name == "my-machine-calibrated"
    assert not list(tmp_path.rglob("escaped*")) and not (tmp_path.parent / "escaped").exists()

    evil = tmp_path / "elsewhere" / "x.yaml"  # a path: named after the file, still the user dir
    evil.parent.mkdir()
    evil.write_text(yaml.safe_dump({**raw, "name": "/abs/x"}))
    assert main(["calibrate", str(run), "--profile", str(evil), "--trials", "3"]) == 0
    assert (user / "x-calibrated.yaml").is_file()
    hidden = tmp_path / ".hidden.yaml"
    hidden.write_text(yaml.safe_dump(raw))
    assert main(["calibrate", str(run), "--profile", str(hidden), "--trials", "3"]) == 2
    assert "plain file name" in capsys.readouterr().err


def _one_run(tmp_path, name="run.json", profile="cpu-gloo", step_time_s=0.01, machine=None):
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "precision": "fp32", "batch": {"micro_batch_size": 1,
                                                          "global_batch_size": 1}})
    path = tmp_path / name
    record = {"plan": plan_to_dict(plan), "profile": profile,
              "measured": {"step_time_s": step_time_s}}
    if machine is not None:
        record["machine"] = machine
    path.write_text(json.dumps(record))
    return str(path)


_refused = assert_refused


def test_calibrate_refuses_a_seed_the_sampler_cannot_take(tmp_path, capsys) -> None:
    # Optuna's TPESampler raised "Seed must be between 0 and 2**32 - 1" after loading the runs
    _refused(capsys, ["calibrate", _one_run(tmp_path), "--profile", "cpu-gloo", "--seed", "-1",
                      "--out", str(tmp_path / "out.yaml")], "--seed: got -1; expected 0 to")
    assert not (tmp_path / "out.yaml").exists()


def test_calibrate_refuses_a_directory_out_before_fitting(tmp_path, capsys) -> None:
    (tmp_path / "adir").mkdir()
    _refused(capsys, ["calibrate", _one_run(tmp_path), "--profile", "cpu-gloo", "--force",
                      "--out", str(tmp_path / "adir")], "--out:", "is a directory")
    assert list((tmp_path / "adir").iterdir()) == []


@pytest.mark.parametrize(("profile", "needle"), [
    ("a100-sxm4-80gb", "recorded on profile 'a100-sxm4-80gb' (A100-SXM4-80GB), not on "
                       "--profile 'cpu-gloo' (cpu-1-thread)"),
    ("nope", "recorded on profile 'nope', which is neither a known profile nor a file"),
])
def test_runs_recorded_on_another_profile_are_refused(tmp_path, capsys, profile, needle) -> None:
    run = _one_run(tmp_path, profile=profile)
    _refused(capsys, ["calibrate", run, "--profile", "cpu-gloo", "--trials", "2",
                      "--out", str(tmp_path / "out.yaml")], f"RUN {run}", needle)
    assert not (tmp_path / "out.yaml").exists()


def test_a_gpu_plan_run_on_this_cpu_calibrates_the_cpu_profile(tmp_path, capsys) -> None:
    """A plan made for an A100 and trained here records machine.device cpu: the measurement is
    this machine's, so it calibrates cpu-gloo (as train's warning says) and not the A100's.
    Before, both were refused, so the record calibrated nothing."""
    run = _one_run(tmp_path, profile="a100-sxm4-80gb", machine={"device": "cpu"})
    code = main(["calibrate", run, "--profile", "cpu-gloo", "--trials", "2",
                 "--out", str(tmp_path / "out.yaml")])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    _refused(capsys, ["calibrate", run, "--profile", "a100-sxm4-80gb", "--trials", "2",
                      "--out", str(tmp_path / "gpu.yaml")], "machine.device",
             "fit a profile of cpu to it")
    assert not (tmp_path / "gpu.yaml").exists()


def test_runs_fit_a_profile_of_their_own_device(tmp_path, capsys) -> None:
    """By name or by path, and a profile measured on the same host (README: runs recorded on
    cpu-gloo calibrate my-machine.yaml from `autoplan profile`)."""
    import yaml

    from autoplan.hardware import PROFILES_DIR

    run = _one_run(tmp_path, profile=str(PROFILES_DIR / "cpu-gloo.yaml"))
    assert main(["calibrate", run, "--profile", "cpu-gloo", "--trials", "2",
                 "--out", str(tmp_path / "out.yaml")]) == 0
    raw = yaml.safe_load((PROFILES_DIR / "cpu-gloo.yaml").read_text())
    raw["device"]["name"] = "cpu-1-thread (x86_64)"  # as `autoplan profile` names it
    (tmp_path / "my-machine.yaml").write_text(yaml.safe_dump({**raw, "name": "my-machine"}))
    assert main(["calibrate", _one_run(tmp_path, "run2.json"), "--profile",
                 str(tmp_path / "my-machine.yaml"), "--trials", "2",
                 "--out", str(tmp_path / "fitted.yaml")]) == 0


def test_a_run_given_twice_is_refused(tmp_path, capsys) -> None:
    run = _one_run(tmp_path)
    _refused(capsys, ["calibrate", run, str(tmp_path / "." / "run.json"), "--profile",
                      "cpu-gloo", "--trials", "2", "--out", str(tmp_path / "out.yaml")],
             "is the same file as", "give each run record once")


@pytest.mark.parametrize("seconds", [1e15, 1e300, 1e-300])
def test_a_step_time_the_fit_cannot_use_is_refused_naming_the_run(tmp_path, capsys,
                                                                   seconds) -> None:
    # 1e15 s made predicted / measured round to 0: "math domain error" from log1p(-1)
    run = _one_run(tmp_path, step_time_s=seconds)
    _refused(capsys, ["calibrate", run, "--profile", "cpu-gloo", "--trials", "2",
                      "--out", str(tmp_path / "out.yaml")],
             f"RUN {run}: measured.step_time_s: got {seconds:g}")


def test_a_run_that_trained_on_another_device_than_the_profiles_is_refused(tmp_path,
                                                                          capsys) -> None:
    """A plan for an A100 profile trained on this CPU host: its record names the A100 profile,
    and calibrate fitted the A100 profile to CPU timings. The record's machine.device (what
    train ran on) decides."""
    cpu = {"torch": "2.13.0+cpu", "world_size": 1, "device": "cpu", "backend": "gloo"}
    run = _one_run(tmp_path, profile="a100-sxm4-80gb", machine=cpu)
    _refused(capsys, ["calibrate", run, "--profile", "a100-sxm4-80gb", "--trials", "2",
                      "--out", str(tmp_path / "out.yaml")],
             f"RUN {run}: machine.device: the run trained on 'cpu', not on the a100",
             "fit a profile of cpu")
    assert not (tmp_path / "out.yaml").exists()
    gpu = {**cpu, "device": "NVIDIA A100-SXM4-80GB", "backend": "nccl"}
    run = _one_run(tmp_path, "gpu.json", profile="a100-sxm4-80gb", machine=gpu)
    assert main(["calibrate", run, "--profile", "a100-sxm4-80gb", "--trials", "2",
                 "--out", str(tmp_path / "out.yaml")]) == 0
    capsys.readouterr()
    _refused(capsys, ["calibrate", run, "--profile", "h100-sxm-80gb", "--trials", "2",
                      "--out", str(tmp_path / "h100.yaml")], "machine.device", "a100")


def test_a_run_with_no_measured_step_is_refused(tmp_path, capsys) -> None:
    run = _one_run(tmp_path, step_time_s=None)
    _refused(capsys, ["calibrate", run, "--profile", "cpu-gloo", "--trials", "2",
                      "--out", str(tmp_path / "out.yaml")],
             f"RUN {run}: measured.step_time_s: null", "two steps or more")


def _run_with_plan(tmp_path, name, plan):
    path = tmp_path / name
    path.write_text(json.dumps({"plan": plan, "profile": "cpu-gloo",
                                "measured": {"step_time_s": 0.01}}))
    return str(path)


_TINY = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1}, "precision": "fp32",
         "batch": {"micro_batch_size": 1, "global_batch_size": 4}}


@pytest.mark.parametrize(("plan", "needle"), [
    ({**_TINY, "model": "nosuch"}, "plan.model: unknown model 'nosuch'; choose a preset"),
    ({**_TINY, "model": "{huge}"}, "plan.model.num_layers: got 99999999999999999999"),
    ({**_TINY, "cluster": {"profile": "cpu-gloo", "num_gpus": 3}, "parallel": {"tp": 3}},
     "plan: parallel.tp=3 does not divide num_heads=4"),
    ({**_TINY, "parallel": {"dp": 3}}, "plan: dp * tp * pp * cp = 3 but the cluster has 1 GPUs"),
    ("p1.yaml", "plan: got 'p1.yaml'; expected a mapping of plan fields"),
], ids=["unknown-model", "absurd-model-file", "tp3-4-heads", "dp3-on-1-gpu", "plan-path"])
def test_a_run_whose_plan_is_wrong_is_refused_naming_the_run_before_fitting(
        tmp_path, capsys, monkeypatch, plan, needle) -> None:
    """An unknown model once failed inside the Optuna study (a traceback naming --model, which
    calibrate has not), and plans that break the rules were fitted with exit 0."""
    import autoplan.calibrate_cli as calibrate_cli

    def no_fit(*_a, **_k):
        raise AssertionError("a study ran")

    monkeypatch.setattr(calibrate_cli, "calibrate", no_fit)
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: x\nnum_layers: 99999999999999999999\nhidden_size: 64\n"
                    "num_heads: 4\nvocab_size: 256\nseq_len: 32\n")
    if isinstance(plan, dict) and plan["model"] == "{huge}":
        plan = {**plan, "model": str(huge)}
    run = _run_with_plan(tmp_path, "run.json", plan)
    err = _refused(capsys, ["calibrate", run, "--profile", "cpu-gloo", "--trials", "2",
                            "--out", str(tmp_path / "out.yaml")], f"RUN {run}: {needle}")
    assert "--model" not in err
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize("value", ["100001", "99999999999", "0"])
def test_an_absurd_trial_count_is_a_typo(tmp_path, capsys, value) -> None:
    """Any count was taken (a typo fitted for days), as export's --max-restarts refuses."""
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal
        # --seed -1 is refused too, later: the parser refuses the count before any fit
        main(["calibrate", _one_run(tmp_path), "--profile", "cpu-gloo", "--trials", value,
              "--seed", "-1", "--out", str(tmp_path / "out.yaml")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--trials: got {value!r}; expected a whole number from 1 to 100,000" in err
    assert not (tmp_path / "out.yaml").exists()
