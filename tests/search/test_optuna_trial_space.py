"""What an Optuna trial may choose: the expert-parallel degrees of a MoE model (valid ones only,
settled exactly inside the trial) and the global batch size of a range (issue #13 item 3,
issue #12 item 2), each checked against the exhaustive search of the same space."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.search.engine import SearchRequest, run_search
from autoplan.search.optuna_search import open_study
from autoplan.search.ranges import batch_sizes
from autoplan.search_space import space_from_dict
from tests.search.conftest import SMALL_SPACE, request

# A MoE whose 64 wide experts (4 blocks x 64 x 3 x 2048 x 8192 = 12.9B parameters) dwarf the rest:
# without EP every rank holds and all-reduces all of them; with EP 8 it holds an eighth.
WIDE_MOE: dict[str, Any] = {
    "name": "wide-moe", "num_layers": 4, "hidden_size": 2048, "num_heads": 16,
    "num_kv_heads": 4, "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_len": 2048,
    "mlp": "swiglu",
    "moe": {"num_experts": 64, "experts_per_token": 2, "expert_ffn_hidden_size": 8192},
}
EP_RULES = {"ep-needs-moe", "ep-divides-experts", "etp-divides-expert-ffn",
            "ep-etp-divides-dp-cp-tp"}


def moe_request(**kw: Any) -> SearchRequest:
    model = load_model(WIDE_MOE)
    space = space_from_dict({**SMALL_SPACE, "precision": "bf16",
                             "parallel": {**SMALL_SPACE["parallel"], "etp": [1, 2]}})
    return SearchRequest(model, model, load_profile("h100-sxm-80gb"), "h100-sxm-80gb", space,
                         (8,), 16, **kw)


def best_row(result) -> dict[str, float]:
    c = result.scored.cols
    keys = ("num_gpus", "dp", "tp", "pp", "cp", "ep", "etp", "zero_stage", "mbs", "gbs")
    return {**{k: int(c[k][result.best]) for k in keys},
            "tokens_per_s": float(c["tokens_per_s"][result.best])}


def test_tpe_finds_the_expert_parallel_plan_the_exhaustive_search_ranks_first() -> None:
    exhaustive = run_search(moe_request(sampler="exhaustive"))
    best = best_row(exhaustive)
    assert best["ep"] > 1  # the case is built so that EP wins: it is not the default 1
    c = exhaustive.scored.cols
    no_ep = exhaustive.order[c["ep"][exhaustive.order] == 1]
    assert len(no_ep) and c["tokens_per_s"][no_ep[0]] < best["tokens_per_s"]

    tpe = run_search(moe_request(sampler="tpe", trials=40, seed=1))
    assert best_row(tpe) == best
    # only valid degrees were proposed: no trial broke an expert-parallel rule
    assert not any(tpe.scored.counts[k] for k in EP_RULES)
    t = tpe.scored.cols
    group = t["dp"] * t["cp"] * t["tp"]
    assert (64 % t["ep"] == 0).all() and (group % (t["ep"] * t["etp"]) == 0).all()


def test_a_dense_model_keeps_ep_1_even_where_the_space_lists_more() -> None:
    space = {**SMALL_SPACE, "parallel": {**SMALL_SPACE["parallel"], "ep": [1, 2, 4]}}
    result = run_search(request(space, sampler="tpe", trials=15, seed=0))
    assert (result.scored.cols["ep"] == 1).all() and result.scored.counts["ep-needs-moe"] == 0


def test_a_space_with_no_valid_ep_is_rejected_by_the_rule_that_says_why() -> None:
    req = moe_request(sampler="random", trials=5, seed=0)
    space = dataclasses.replace(req.space, parallel=dataclasses.replace(req.space.parallel,
                                                                         ep=(128,)))
    result = run_search(dataclasses.replace(req, space=space, space_given=None))
    assert result.best is None and result.scored.counts["ep-divides-experts"] > 0


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "random"])
def test_a_batch_range_is_sampled_within_it_and_finds_the_exhaustive_winner(sampler) -> None:
    lo, hi = 8, 48
    exhaustive = run_search(request(gbs=lo, global_batch_size_max=hi, sampler="exhaustive"))
    found = run_search(request(gbs=lo, global_batch_size_max=hi, sampler=sampler, trials=60,
                               seed=2))
    c = found.scored.cols
    tried = set(c["gbs"].tolist())
    assert len(tried) > 1  # the batch is a knob of the trial, not the range's lower end
    for g, dp in zip(c["gbs"].tolist(), c["dp"].tolist(), strict=True):
        assert lo <= g <= hi and g in batch_sizes(lo, hi, dp)  # the exhaustive search's list
    assert best_row(found)["tokens_per_s"] == pytest.approx(best_row(exhaustive)["tokens_per_s"],
                                                            rel=1e-12)


def test_a_study_of_one_batch_size_is_not_resumed_by_a_range(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'study.db'}"
    one = request(sampler="tpe", trials=3, storage=db, study="s")
    open_study(one, "tpe")
    with pytest.raises(ConfigError, match="different search"):
        open_study(dataclasses.replace(one, global_batch_size_max=32), "tpe")
    open_study(one, "tpe")  # the same request still resumes


def test_cli_tpe_search_takes_a_batch_range(capsys) -> None:
    code = main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                 "--space", "small-cpu", "--sampler", "tpe", "--trials", "20",
                 "--global-batch-size", "8..32", "--format", "json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    best = json.loads(out.out)["best"]
    gbs = best["batch"]["global_batch_size"]
    assert 8 <= gbs <= 32
    assert gbs % (best["parallel"]["dp"] * best["batch"]["micro_batch_size"]) == 0
    assert np.isfinite(best["predicted"]["tokens_per_s"])


def test_optuna_searches_name_the_runtime_they_priced() -> None:
    """A TPE search under a runtime records that runtime, as the exhaustive one does: the
    winner's `predicted.runtime`, and estimate's cross-check, price it with the same traits."""
    from autoplan.cost.runtimes import load_runtime

    megatron = load_runtime("megatron")
    for sampler, kw in (("exhaustive", {}), ("tpe", {"trials": 10, "seed": 0})):
        result = run_search(moe_request(sampler=sampler, runtime=megatron, **kw))
        assert result.scored.runtime == "megatron", sampler
    plain = run_search(moe_request(sampler="tpe", trials=5, seed=0))
    assert plain.scored.runtime == "autoplan-cuda"  # the profile's device's own runtime


def test_a_study_is_resumed_only_under_the_runtime_that_priced_it(tmp_path) -> None:
    """Records priced under Megatron's traits are not mixed with autoplan's: resuming the
    study under another runtime is refused in one line, under the same one it resumes."""
    import pytest

    from autoplan.cost.runtimes import load_runtime
    from autoplan.errors import ConfigError

    url = f"sqlite:///{tmp_path / 'study.db'}"
    megatron = load_runtime("megatron")
    run_search(moe_request(sampler="tpe", trials=4, seed=0, runtime=megatron, storage=url,
                           study="s"))
    run_search(moe_request(sampler="tpe", trials=4, seed=0, runtime=megatron, storage=url,
                           study="s"))
    with pytest.raises(ConfigError, match="different search"):
        run_search(moe_request(sampler="tpe", trials=4, seed=0, storage=url, study="s"))


def test_a_fixed_choice_the_layout_does_not_offer_rejects_the_trial() -> None:
    """A local move keeps vpp's index while pp moves: an index past the new pp's depths (or a
    category the space lacks) is no layout, not an IndexError (practitioner_search crashed on
    Mixtral 8x22B with a fixed vpp index 6 of 3)."""
    import optuna

    from autoplan.search.trial_space import suggest_layout

    req = request(SMALL_SPACE)
    study = optuna.create_study()
    offered = {"tp": 0, "pp": 1, "schedule": "interleaved-1f1b", "vpp": 1, "attention": "flash"}
    study.enqueue_trial(offered, skip_if_exists=False)
    trial = study.ask()
    layout = suggest_layout(trial, req)
    assert layout is not None and (layout["pp"], layout["vpp"]) == (2, 2)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    for fixed in ({**offered, "vpp": 99}, {**offered, "attention": "xformers"},
                  {**offered, "tp": 7}):
        study.enqueue_trial(fixed, skip_if_exists=False)
        trial = study.ask()
        assert suggest_layout(trial, req) is None, fixed
        study.tell(trial, state=optuna.trial.TrialState.FAIL)


def test_a_trial_samples_only_degrees_that_divide_a_gpu_count(capsys) -> None:
    """At --num-gpus 1 nineteen of twenty random trials of small-cpu sampled a tp, pp or cp
    above 1 and were rejected (world-size), so the search ended with no plan; pp 3 at 64 GPUs
    the same. A degree that divides no GPU count of the request is not sampled."""
    from autoplan.search.trial_space import degrees

    assert degrees((1, 2, 3, 4, 6, 8, 35, 64), (64,)) == [1, 2, 4, 8, 64]
    assert degrees((1, 2, 3), (4, 6)) == [1, 2, 3]  # 3 divides 6
    assert degrees((2, 4), (1,)) == [2, 4]  # none fills 1 GPU: rejected as before
    assert main(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "1",
                 "--global-batch-size", "2", "--space", "small-cpu", "--sampler", "random",
                 "--trials", "8", "--format", "json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert "world-size" not in counts and counts["feasible"] >= 1, counts


def test_a_filtered_degree_list_is_another_parameter() -> None:
    """A trial stores an index into its degree list: where the request drops degrees the
    index is suggested under another name, so a study stored before (indexes into the whole
    list) keeps meaning what it meant; where it drops none the name, and the study, are as
    before."""
    import optuna

    from autoplan.search.trial_space import suggest_layout

    whole = request(SMALL_SPACE, gpus=(4,))  # tp, pp in 1, 2, 4: all divide 4
    odd = request({**SMALL_SPACE, "parallel": {**SMALL_SPACE["parallel"], "tp": [1, 3, 4]}},
                  gpus=(4,))
    names = []
    for req in (whole, odd):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        trial = study.ask()
        suggest_layout(trial, req)
        names.append(set(trial.params))
    assert {"tp", "pp"} <= names[0] and "tp@fit" not in names[0]
    assert "tp@fit" in names[1] and "tp" not in names[1] and "pp" in names[1]
