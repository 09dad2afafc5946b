"""`autoplan calibrate` fits only what the runs can tell, never writes over its inputs or where
`--profile` cannot load from, and refuses an impossible peak memory before it fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from autoplan.calibrate import (
    UNFELT,
    apply_factors,
    calibrate,
    identity,
    left_factors,
    load_run,
    step_errors,
)
from autoplan.commands import main
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict
from autoplan.plan_files import plan_to_dict
from tests.cli_refusals import assert_refused

SINGLE_NODE = [{"parallel": {"dp": 2}}, {"parallel": {"tp": 2}, "sequence_parallel": True},
               {"parallel": {"pp": 2}}, {"parallel": {"dp": 4}, "zero_stage": 3}]
"""The reviewer's runs (/tmp/review_a/mkruns.py): one cpu-gloo node, each measured at twice its
prediction; every collective is priced from the profile's measured tables, none from its links."""
LINKS = ("link_bandwidth", "link_latency")


def _runs(tmp_path: Path, plans: list[dict], suffix: str = "json") -> list[Path]:
    base, paths = load_profile("cpu-gloo"), []
    for i, extra in enumerate(plans):
        par = extra["parallel"]
        n = par.get("dp", 1) * par.get("tp", 1) * par.get("pp", 1)
        plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": n},
                               "precision": "fp32", "attention": "eager",
                               "batch": {"micro_batch_size": 1, "global_batch_size": 16},
                               **extra})
        est = estimate_plan(plan, ClusterSpec(base, n))
        record = {"schema_version": 1, "plan": plan_to_dict(plan), "profile": "cpu-gloo",
                  "measured": {"step_time_s": 2.0 * est.step_time_s,
                               "peak_memory_bytes": 1.3 * est.memory_total_bytes},
                  "machine": {"device": "cpu"}}
        path = tmp_path / f"run{i}.{suffix}"
        path.write_text(json.dumps(record) if suffix == "json" else yaml.safe_dump(record))
        paths.append(path)
    return paths


def test_factors_no_run_can_feel_are_left_at_one_and_named(tmp_path) -> None:
    """Single-node runs "fitted" link_bandwidth to 0.155, though 0.1 and 10 gave every run the
    same error: a value the sampler happened to draw, written into the profile."""
    base = load_profile("cpu-gloo")
    runs = [load_run(p) for p in _runs(tmp_path, SINGLE_NODE)]
    for name in LINKS:  # the premise: the runs cannot feel them
        assert step_errors(runs, apply_factors(base, {**identity(base), name: 0.1})) == \
            step_errors(runs, apply_factors(base, {**identity(base), name: 10.0}))
    result = calibrate(runs, base, trials=40, seed=0)
    assert {name: result.factors[name] for name in LINKS} == {name: 1.0 for name in LINKS}
    assert result.profile.intra_node == base.intra_node
    assert result.profile.inter_node == base.inter_node
    assert {name: result.summary()["factors_left"][name] for name in LINKS} == \
        {name: UNFELT for name in LINKS}
    # and the factors it did fit moved (the runs measured 2x their prediction); which ones fit
    # depends on their shares of the step, so none is named here
    fitted = [name for name in result.factors if name not in result.left]
    assert fitted and all(result.factors[name] != 1.0 for name in fitted)


def test_a_run_across_nodes_feels_the_links(tmp_path) -> None:
    """The probe is no blanket rule: dp=16 spans two 8-GPU nodes, priced over the links."""
    runs = [load_run(p) for p in _runs(tmp_path, [*SINGLE_NODE, {"parallel": {"dp": 16}}])]
    assert set(LINKS).isdisjoint(left_factors(runs, load_profile("cpu-gloo")))


def test_the_cli_says_which_factors_it_left_and_writes_them_unchanged(tmp_path, capsys) -> None:
    out = tmp_path / "fitted.yaml"
    paths = _runs(tmp_path, SINGLE_NODE)
    assert main(["calibrate", *map(str, paths), "--profile", "cpu-gloo", "--out", str(out),
                 "--trials", "20", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {name: data["factors_left"][name] for name in LINKS} == {name: UNFELT for name in LINKS}
    # the rest left are those 4 plans cannot identify: felt, so named apart
    assert set(data["factors_left"]) - set(LINKS) == set(data["factors_unidentified"])
    fitted, base = load_profile(out), load_profile("cpu-gloo")
    assert (fitted.intra_node, fitted.inter_node) == (base.intra_node, base.inter_node)
    assert main(["calibrate", *map(str, paths), "--profile", "cpu-gloo", "--out",
                 str(tmp_path / "again.yaml"), "--trials", "20", "--format", "table"]) == 0
    assert "left link_bandwidth unchanged: no run's predicted step time changes with it" in \
        capsys.readouterr().out.replace("\n", " ")


@pytest.mark.parametrize("link", [False, True])
def test_out_over_an_input_run_is_refused_even_with_force(tmp_path, capsys, link) -> None:
    run = _runs(tmp_path, SINGLE_NODE[:1], suffix="yaml")[0]
    before = run.read_text()
    out = run
    if link:
        out = tmp_path / "fitted.yaml"
        out.symlink_to(run)
    assert_refused(capsys, ["calibrate", str(run), "--profile", "cpu-gloo", "--out", str(out),
                            "--force", "--trials", "2"], "--out:", "is a run record being fitted")
    assert run.read_text() == before


def test_out_over_the_profile_being_fitted_is_refused(tmp_path, capsys) -> None:
    run = _runs(tmp_path, SINGLE_NODE[:1])[0]
    profile = tmp_path / "mine.yaml"
    profile.write_text(yaml.safe_dump(yaml.safe_load(
        (Path(__file__).parents[2] / "profiles" / "cpu-gloo.yaml").read_text())))
    before = profile.read_text()
    assert_refused(capsys, ["calibrate", str(run), "--profile", str(profile), "--out",
                            str(profile), "--force", "--trials", "2"],
                   "is the profile being fitted")
    assert profile.read_text() == before


def test_out_without_a_yaml_suffix_is_refused_as_profile_refuses_it(tmp_path, capsys,
                                                                    monkeypatch) -> None:
    """`--out fitted` wrote a profile `--profile fitted` reads as a name and cannot find."""
    monkeypatch.chdir(tmp_path)
    run = _runs(tmp_path, SINGLE_NODE[:1])[0]
    assert_refused(capsys, ["calibrate", str(run), "--profile", "cpu-gloo", "--out", "fitted",
                            "--trials", "2"], "--out: 'fitted' does not end in .yaml or .yml")
    assert not (tmp_path / "fitted").exists()


def test_a_peak_above_the_device_memory_is_refused_before_the_fit(tmp_path, capsys,
                                                                 monkeypatch) -> None:
    """It failed after the whole study, naming reserved_bytes: neither the run nor its field."""
    import autoplan.calibrate_cli as calibrate_cli

    def no_fit(*_a, **_k):
        raise AssertionError("a study ran")

    monkeypatch.setattr(calibrate_cli, "calibrate", no_fit)
    run = _runs(tmp_path, SINGLE_NODE[:1])[0]
    record = json.loads(run.read_text())
    record["measured"]["peak_memory_bytes"] = 4.5e9  # cpu-gloo's device holds 4 GiB
    run.write_text(json.dumps(record))
    out = tmp_path / "out.yaml"
    assert_refused(capsys, ["calibrate", str(run), "--profile", "cpu-gloo", "--out", str(out)],
                   f"RUN {run}: measured.peak_memory_bytes: 4.5e+09 bytes, above the "
                   "4294967296 bytes")
    assert not out.exists()
