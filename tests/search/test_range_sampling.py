"""A GPU-count range must not end in a false "no feasible plan" (user test: llama-3.1-70b on
64..1024 H100s, `--objective gpus`, exit 3 after TPE scored 1 of 300 trials while 1024 GPUs
alone held 54,226 feasible plans). Three causes, each pinned on a small range that runs in
seconds: the sampler choice counted layouts the exhaustive search never lists, TPE's trials
drew GPU counts their tp * pp * cp could not fill, and the exit-3 line said nothing fits where
too few trials were scored to say so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from autoplan.commands import main
from autoplan.search.engine import run_search
from autoplan.search.optuna_search import open_study
from autoplan.search.space import enumerate_space
from autoplan.search.targets import Targets
from autoplan.search.trial_space import COUNT_PARAM
from tests.search.conftest import request

# llama-3-8b on 8..256 H100s (32 counts) at batch 256: pp 3 and 6, cp 4 and tp 8 fill few
# counts, and a dp of 3 or 5 cannot divide the batch
RANGE_SPACE: dict[str, Any] = {
    "schema_version": 1, "name": "range-test",
    "parallel": {"dp": None, "tp": [1, 2, 4, 8], "pp": [1, 2, 3, 4, 6, 8], "cp": [1, 2, 4]},
    "sequence_parallel": [False, True],
    "pipeline": {"schedule": ["1f1b"], "vpp": [1]},
    "zero_stage": [1], "offload": {"optimizer": [False], "params": [False]},
    "recompute": {"policy": ["none", "full"], "num_layers": [None]},
    "micro_batch_size": [1, 2], "precision": "bf16", "attention": ["flash"],
}
COUNTS = tuple(range(8, 257, 8))
TARGETS = Targets(objectives=("gpus",), deadline_days=2.0, train_tokens=1e11)
ARGV = ["search", "--model", "llama-3-8b", "--cluster", "h100-sxm-80gb", "--num-gpus",
        "8..256", "--global-batch-size", "256", "--objective", "gpus", "--deadline-days", "2",
        "--train-tokens", "1e11", "--format", "json"]


def range_request(max_enumerate: int, gpus: tuple[int, ...] = COUNTS, **kw: Any):
    return request({**RANGE_SPACE, "max_enumerate": max_enumerate}, model="llama-3-8b",
                   cluster="h100-sxm-80gb", gpus=gpus, gbs=256, targets=TARGETS, **kw)


def answer() -> int:
    """The fewest GPUs that meet the deadline: every count scored in one pass."""
    whole = run_search(range_request(10**9, sampler="exhaustive"))
    assert whole.best is not None
    return int(whole.scored.cols["num_gpus"][whole.best])


def test_counts_that_each_list_under_max_enumerate_are_scored_count_by_count(
        space_file, capsys) -> None:
    req = range_request(400)
    # the premise: with the layouts whose dp cannot divide the batch (counted by rule, never
    # listed) 192 GPUs would hold more than 400 candidates; listed, every count holds fewer
    enums = {n: enumerate_space(req.space, req.model, (n,), 256) for n in (192, 256)}
    assert max(len(e.table["dp"]) for e in enums.values()) <= 400
    assert len(enums[192].table["dp"]) + sum(enums[192].precounted.values()) > 400
    path = space_file({**RANGE_SPACE, "max_enumerate": 400})
    # before: TPE over the whole range, 10 trials, exit 3 "no feasible plan"
    assert main([*ARGV, "--space", str(path), "--trials", "10"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sampler"] == "exhaustive"
    assert data["best"]["cluster"]["num_gpus"] == answer() == max(data["num_gpus_scored"])
    assert answer() < 256  # so stopping at the first count that meets the targets is seen


def test_tpe_trials_take_a_count_their_degrees_fill() -> None:
    result = run_search(range_request(300, trials=20))  # 256 GPUs list 336: TPE takes over
    assert result.sampler == "tpe"
    counts, c = result.scored.counts, result.scored.cols
    # before: 11 of 20 trials drew a count tp * pp * cp cannot fill, and 1 was feasible
    assert counts["world-size"] == 0 and counts["feasible"] >= 5
    inner = c["tp"] * c["pp"] * c["cp"]
    assert (c["dp"] * inner == c["num_gpus"]).all() and (256 % c["dp"] == 0).all()
    assert set(c["num_gpus"].tolist()) <= set(COUNTS)
    assert int(c["num_gpus"][result.best]) >= answer()  # sampled: never below the exact answer


def test_the_count_is_a_parameter_of_its_own_so_stored_studies_keep_their_meaning(
        tmp_path: Path) -> None:
    """Studies stored before drew `num_gpus` and took that count or nothing: the nearest
    count that fills is another parameter, so their trials mean what they meant."""
    db = f"sqlite:///{tmp_path / 's.db'}"

    def params(**kw: Any) -> list[dict[str, Any]]:
        req = range_request(300, trials=3, storage=db, sampler="tpe", **kw)
        run_search(req)
        done = open_study(req, "tpe").get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(done) == 3
        return [t.params for t in done]

    assert all(COUNT_PARAM in p and "num_gpus" not in p for p in params(study="range"))
    # one count: nothing to draw
    assert all(COUNT_PARAM not in p and "num_gpus" not in p
               for p in params(study="one", gpus=(64,)))


def test_a_sampled_search_that_scored_few_trials_says_so_on_exit_3(space_file, capsys) -> None:
    # only pp 1 divides 32 layers evenly: most trials break pp-vpp-divides-layers unscored
    space = {**RANGE_SPACE, "parallel": {"dp": None, "tp": [1, 2, 4, 8], "pp": [1, 3, 5, 6, 7],
                                         "cp": [1]},
             "pipeline": {"schedule": ["1f1b"], "vpp": [1], "split": ["even"]}}
    argv = [*ARGV[:-6], "--deadline-days", "0.01", "--train-tokens", "1e11", "--format", "json",
            "--space", str(space_file(space)), "--sampler", "tpe", "--trials", "12"]
    assert main(argv) == 3
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    scored = data["counts"].get("deadline", 0) + data["counts"].get("out-of-memory", 0)
    rejected = 12 - scored
    assert 2 * rejected > 12 and not data["feasible"]
    note = (f"TPE scored {scored} of 12 trials ({rejected} broke a plan rule before any "
            "estimate), too few to say nothing fits: raise --trials or narrow --num-gpus")
    assert data["nearest"]["misses"][-1] == note
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(note)


def test_no_such_note_where_most_trials_were_scored(space_file, capsys) -> None:
    argv = [*ARGV[:-6], "--deadline-days", "0.01", "--train-tokens", "1e11", "--format", "json",
            "--space", str(space_file({**RANGE_SPACE, "max_enumerate": 300})), "--trials", "12"]
    assert main(argv) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["sampler"] == "tpe" and data["scored"] * 2 >= 12
    assert not any("raise --trials" in m for m in data["nearest"]["misses"])


def test_a_sampled_range_lists_the_counts_its_trials_scored() -> None:
    """num_gpus_scored said every count of a sampled range was scored (57 counts for 4 in the
    trials): it lists the counts the trials scored."""
    from autoplan.search.output import summary

    result = run_search(range_request(300, trials=20))
    assert result.sampler == "tpe"
    scored = sorted({int(n) for n in result.scored.cols["num_gpus"]})
    assert summary(result, top=3)["num_gpus_scored"] == scored
    assert len(scored) < len(COUNTS)


def test_fp8_rows_a_gpu_type_lacks_are_not_rules_more_trials_cure() -> None:
    """An A100's fp8 trials counted precision-unsupported (a study stored before a trial drew
    only the formats its device runs: trial_space.pick_precision) do not alone make the
    infeasible line say to raise --trials."""
    from types import SimpleNamespace

    from autoplan.search.sampled import sampling_note

    req = range_request(300)
    miss = {"out-of-memory": 2}
    rule = SimpleNamespace(counts={**miss, "world-size": 8})
    unsupported = SimpleNamespace(counts={**miss, "precision-unsupported": 8})
    assert "raise --trials" in (sampling_note(req, "tpe", rule, 10) or "")  # type: ignore[arg-type]
    assert sampling_note(req, "tpe", unsupported, 10) is None  # type: ignore[arg-type]
