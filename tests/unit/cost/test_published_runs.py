"""The cost model against measured runs of Megatron SC21 and Korthikanti et al. 2022.

The runs live in tests/data/published/published-open.yaml (Megatron SC21 Tables 1-2, Korthikanti
et al. 2022 Table 5); benchmarks/published_accuracy.py prints the per-run table. Nothing is fitted
to these runs, so this guards the model against drifting away from them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "published" / "published-open.yaml"


def _bench():
    return load_script("published_accuracy")


def test_step_time_error_on_published_runs() -> None:
    bench = _bench()
    rows = bench.score(DATA)
    assert len(rows) >= 20
    mape = sum(abs(r["error"]) for r in rows) / len(rows)
    assert mape <= 0.10, f"mean absolute percentage error {mape:.1%}"
    assert max(abs(r["error"]) for r in rows) <= 0.25
    assert all(r["feasible"] for r in rows), "a run that trained must be predicted to fit"


def test_one_paper_is_one_source() -> None:
    """SC21's Tables 1 and 2 are one paper, as are Korthikanti et al.'s Table 5 and its sec.
    6.3 text: leaving a source out leaves the whole paper out."""
    sources = {r["id"]: r["source"] for r in _bench().score(DATA)}
    assert sources["sc21-table1-1.7b"] == sources["sc21-table2-ptd-175b-384gpu"]
    assert sources["korthikanti-22b-full-recompute"] == sources["korthikanti-530b-sp-selective-dp8"]
    assert len(set(sources.values())) == 2


def test_runs_left_out_are_listed_with_the_reason() -> None:
    """Every run of the file is scored or listed; SC21's ZeRO-3 rows, whose recompute policy is
    unpublished, are priced as DeepSpeed ran them under both policies, beside the measured time."""
    bench = _bench()
    skipped = {s["id"]: s for s in bench.not_scored(DATA)}
    runs = yaml.safe_load(DATA.read_text())["runs"]
    assert len(skipped) + len(bench.score(DATA)) == len(runs)
    zero3 = [s for s in skipped.values() if "zero3" in s["id"]]
    assert len(zero3) == 6 and len(skipped) == 7
    for s in zero3:
        assert s["reason"] == "test_quality partial: plan.recompute not published"
        assert s["runtime"] == "deepspeed" and s["measured_s"] > 0
        assert s["predicted"]["none"]["step_s"] < s["predicted"]["full"]["step_s"]
    assert "plan.global_batch not published" in skipped["korthikanti-530b-full-recompute-dp8"]["reason"]


def test_runs_predicted_not_to_fit_are_counted_and_named(tmp_path: Path, capsys) -> None:
    """A run that ran stays in the MAPE, and the report says it is predicted not to fit and why;
    a run on a GPU without a profile is listed as not scored."""
    data = yaml.safe_load(DATA.read_text())
    run = next(r for r in data["runs"] if r["id"] == "sc21-table1-145.6b")
    on_v100 = {**run, "id": "on-v100", "cluster": {**run["cluster"], "gpu": "V100-SXM2-32GB"}}
    on_tpu = {**run, "id": "on-tpu", "cluster": {**run["cluster"], "gpu": "TPU v4"}}
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump({**data, "runs": [run, on_v100, on_tpu]}))
    assert _bench().main(["--data", str(path), "--no-practitioner"]) == 0
    out = capsys.readouterr().out
    assert "2 of the 3 runs of runs.yaml scored" in out and "1 of them predicted not to fit" in out
    assert "ran, but predicted not to fit: on-v100 (needs " in out
    assert "on-tpu" in out.split("not scored: 1 runs")[1]


def test_a_users_profile_of_the_same_name_does_not_change_a_score(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """`autoplan calibrate` writes profiles to the user's directory, which load_profile searches
    first: the harness prices on the packaged datasheet profile all the same."""
    from autoplan.hardware import load_profile

    bench, practitioner = _bench(), load_script("practitioner")
    entry = next(e for e in practitioner.load_data(practitioner.DEFAULT_DATA)
                 if e["id"] == "torchtitan-llama3-8b-64a100-fsdp-sel-op")
    before = ([r["predicted_s"] for r in bench.score(DATA)],
              practitioner.score_entry(entry)["predicted_s"])
    profile = yaml.safe_load((ROOT / "profiles" / "a100-sxm4-80gb.yaml").read_text())
    profile["device"]["peak_flops_per_s"] = {k: float(v) / 2 for k, v in  # "312.0e12": a str
                                             profile["device"]["peak_flops_per_s"].items()}
    (tmp_path / "autoplan" / "profiles").mkdir(parents=True)
    (tmp_path / "autoplan" / "profiles" / "a100-sxm4-80gb.yaml").write_text(yaml.safe_dump(profile))
    monkeypatch.delenv("AUTOPLAN_PROFILES", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_profile("a100-sxm4-80gb").device.peak("fp16") == 156e12  # the shadow is found
    after = ([r["predicted_s"] for r in bench.score(DATA)],
             practitioner.score_entry(entry)["predicted_s"])
    assert after == before


def test_sc21_flop_convention_is_reproduced() -> None:
    from autoplan.model_spec import load_model

    schema = load_script("published_schema")
    model = load_model({"name": "gpt3", "num_layers": 96, "hidden_size": 12288, "num_heads": 96,
                        "vocab_size": 51200, "seq_len": 2048})
    per_token, name = schema.flops_per_token("Megatron eq. (3): 96*B*s*l*h^2*(...)", model)
    assert name == "megatron-sc21"
    # SC21 Table 2: 175B at 1536 GPUs, 141 TFLOP/s per GPU, 300B tokens in ~23 days.
    seconds = 1536 * 2048 * per_token / (141e12 * 1536)
    days = 300e9 / (1536 * 2048) * seconds / 86400
    assert days == pytest.approx(23, rel=0.05)


def test_error_bands_are_upper_bounds_that_widen_with_fewer_runs() -> None:
    bench = _bench()
    # chi-squared 5% quantiles (tables): 0.711 at 4, 3.940 at 10, 7.962 at 16 degrees of freedom
    assert abs(bench.chi2_lower(4) - 0.711) / 0.711 < 0.03
    for n, exact in ((10, 3.940), (16, 7.962)):
        assert abs(bench.chi2_lower(n) - exact) / exact < 0.01
    errors = [0.05, -0.05, 0.05, -0.05]
    assert bench.band_of(errors) > bench.rms(errors)  # an upper bound, not the RMS itself
    assert bench.band_of(errors * 4) < bench.band_of(errors)  # 16 runs pin it down better
    assert math.isnan(bench.band_of(errors[:2]))  # two runs bound nothing: no band of their own


def test_a_moe_plan_never_takes_a_dense_band() -> None:
    """autoplan-cuda borrows torchtitan's residuals, which hold no MoE run: a Mixtral plan
    takes the MoE runs' band (Megatron's), not the dense family's ~7%."""
    from autoplan.cost.error_band import KINDS, band_table
    from autoplan.cost.estimate import estimate_plan
    from autoplan.plan import plan_from_dict

    _, families, groups = band_table()
    moe_bands = [b for (_, kind, _), b in groups.items() if kind == KINDS.index("moe")]
    assert moe_bands and max(moe_bands) > families["torchtitan"]
    plan = plan_from_dict({"model": "mixtral-8x7b",
                           "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
                           "parallel": {"dp": 32, "pp": 2, "ep": 8},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 512}})
    dense = plan_from_dict({"model": "llama-3-8b",
                            "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
                            "parallel": {"dp": 32, "pp": 2},
                            "batch": {"micro_batch_size": 1, "global_batch_size": 512}})
    assert estimate_plan(plan).error_band == pytest.approx(max(moe_bands))
    assert estimate_plan(dense).error_band < max(moe_bands)


def test_bias_is_the_mean_of_measured_over_predicted() -> None:
    # predicted 25% slow (measured / predicted 0.8) and 20% fast (1.25): +2.5% on average
    assert _bench().bias_of([0.25, -0.2]) == pytest.approx(0.025)


def test_estimate_carries_the_bias_of_the_runs_behind_its_band() -> None:
    """A Megatron 3D plan on 64 GPUs takes the band and bias of the megatron 3d cluster group
    of error_bands.yaml; a MoE plan without MoE runs of its family the widest MoE group's."""
    from autoplan.cost.error_band import KINDS, SCALES, _bands
    from autoplan.cost.estimate import estimate_plan
    from autoplan.plan import plan_from_dict

    groups = {(g["family"], g["kind"], g["scale"]): g for g in _bands()["groups"]}
    plan = plan_from_dict({"model": "llama-3-70b",
                           "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
                           "parallel": {"dp": 4, "tp": 4, "pp": 4}, "sequence_parallel": True,
                           "batch": {"micro_batch_size": 1, "global_batch_size": 128}})
    est = estimate_plan(plan, runtime="megatron")
    group = groups[("megatron", KINDS[2], SCALES[1])]
    assert group["runs"] >= 3 and group["bias"] != 0
    assert (est.error_band, est.error_bias) == pytest.approx((group["band"], group["bias"]))
    moe = plan_from_dict({"model": "mixtral-8x7b",
                          "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 64},
                          "parallel": {"dp": 32, "pp": 2, "ep": 8},
                          "batch": {"micro_batch_size": 1, "global_batch_size": 512}})
    widest = max((g for g in groups.values() if g["kind"] == "moe" and g["runs"] >= 3),
                 key=lambda g: g["band"])
    est = estimate_plan(moe)  # autoplan-cuda: torchtitan's residuals, none of them MoE
    assert (est.error_band, est.error_bias) == pytest.approx((widest["band"], widest["bias"]))
