"""calibrate_identify.chosen_factors: runs of one plan identify one factor, the one that
governs most of their predicted step time; the others they feel are left, named with their
share, and a plan counts once however many runs (and predictions) it has."""

from __future__ import annotations

import json
import re

from autoplan.calibrate_cli import fitted_line
from autoplan.calibrate_identify import UNFELT, chosen_factors, share_words
from autoplan.calibrate_runs import load_run
from autoplan.cost.estimate import estimate_plan
from autoplan.hardware import ClusterSpec, load_profile
from autoplan.plan import plan_from_dict
from autoplan.plan_files import plan_to_dict

PLAN = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
        "precision": "fp32", "attention": "eager",
        "batch": {"micro_batch_size": 2, "global_batch_size": 16}}


def _run(tmp_path, name, parallel, predicted=None, slower=1.5):
    plan = plan_from_dict({**PLAN, "parallel": parallel}).replace(predicted=predicted)
    step = estimate_plan(plan, ClusterSpec(load_profile("cpu-gloo"), 2)).step_time_s * slower
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"plan": plan_to_dict(plan), "profile": "cpu-gloo",
                                "measured": {"step_time_s": step}}))
    return load_run(path)


def test_one_plan_fits_the_factor_with_the_largest_share(tmp_path) -> None:
    base = load_profile("cpu-gloo")
    runs = [_run(tmp_path, "a", {"dp": 2}),
            _run(tmp_path, "b", {"dp": 2}, predicted={"step_time_s": 0.1}, slower=1.4)]
    left, shares = chosen_factors(runs, base)
    fitted = [name for name in shares if name not in left]
    assert len(fitted) == 1  # one plan, counted once: its two runs tell one ratio
    assert all(shares[fitted[0]] >= shares[name] for name in shares)
    for name, share in shares.items():
        if name != fitted[0]:
            assert left[name].startswith("1 different plan identifies 1 factor")
            assert share_words(name, share) in left[name]
    assert left["link_bandwidth"] == left["link_latency"] == UNFELT  # one node: tables price it


def test_two_plans_fit_two_factors(tmp_path) -> None:
    base = load_profile("cpu-gloo")
    runs = [_run(tmp_path, "dp", {"dp": 2}), _run(tmp_path, "tp", {"tp": 2})]
    left, shares = chosen_factors(runs, base)
    fitted = [name for name in shares if name not in left]
    assert len(fitted) == 2
    assert min(shares[n] for n in fitted) >= max(shares[n] for n in shares if n in left)


def test_the_multipliers_shares_split_the_step_and_overlaps_is_said_apart(tmp_path) -> None:
    """calibrate and tune printed compute 19%, memory_bandwidth 24%, collective_tables 39%,
    op_overhead_s 10%, host_overheads 8% and overlap 15%: 115% (user test 34, finding 11). The
    multipliers' shares split the predicted step time; overlap's is the communication it could
    hide, inside collective_tables' share, and is said so rather than added."""
    runs = [_run(tmp_path, "a", {"dp": 2}),
            _run(tmp_path, "b", {"dp": 2}, slower=1.2)]
    left, shares = chosen_factors(runs, load_profile("cpu-gloo"))
    assert shares["overlap"] > 0.01  # a dp plan on cpu-gloo: exposed all-reduce to hide
    split = sum(share for name, share in shares.items() if name != "overlap")
    assert abs(split - 1.0) < 0.01, shares
    assert share_words("overlap", 0.15) == "could hide 15% of the predicted step time"
    line = fitted_line({"distinct_plans": 1, "factor_shares": shares,
                        "factors_fitted": [n for n in shares if n not in left],
                        "factors_unidentified": [n for n in shares if n in left]})
    shown = re.findall(r"(\w+) \((could hide )?(\d+)%\)", line)
    assert {name for name, _, _ in shown} == set(shares)
    assert [name for name, hide, _ in shown if hide] == ["overlap"]
    assert 98 <= sum(int(pct) for _, hide, pct in shown if not hide) <= 102, line
    assert "the shares add up to 100%" in line, line
