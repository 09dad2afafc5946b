"""Ranges answered right: a GPU-count range scored count by count, the README's --objective gpus
example against an exhaustive list of counts, global batch size ranges (issue #12 items 2, 5)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import numpy as np
import pytest

from autoplan.commands import main
from autoplan.plan_rules import RULE_KEYS
from autoplan.search.engine import run_search
from autoplan.search.output import summary
from autoplan.search.ranges import batch_sizes, parse_gpu_counts
from autoplan.search.scoring import first_rule
from autoplan.search.space import (
    _joint,
    _materialize,
    _rest_axes,
    enumerate_space,
    layouts,
)
from autoplan.search.targets import Targets
from tests.search.conftest import request

README = dict(model="gpt3-175b", cluster="a100-sxm4-80gb", gbs=1536,
              targets=Targets(objectives=("gpus",), deadline_days=30, train_tokens=300e9))


def test_readme_gpus_example_is_the_smallest_count_of_an_exhaustive_list() -> None:
    counts = parse_gpu_counts("64..1024", 8)
    ranged = run_search(request("default", gpus=counts, **README))
    assert ranged.sampler == "exhaustive" and ranged.best is not None
    answer = int(ranged.scored.cols["num_gpus"][ranged.best])
    # the exhaustive list: every count of the range up to the answer that some tp*pp*cp of the
    # space fills with a dp dividing the batch (the others cannot hold a plan), all scored in
    # one search that does not stop early
    space = ranged.request.space.parallel
    listed = tuple(n for n in counts if n <= answer and any(
        n % (t * p * c) == 0 and 1536 % (n // (t * p * c)) == 0
        for t, p, c in itertools.product(space.tp, space.pp, space.cp)))
    flat = run_search(request("default", gpus=listed, **{
        **README, "targets": dataclasses.replace(README["targets"], objectives=("throughput",))}))
    c = flat.scored.cols
    feasible = sorted(set(c["num_gpus"][flat.scored.feasible].tolist()))
    assert feasible and answer == feasible[0] < max(counts) and len(listed) > 2
    assert ranged.scored.counts["feasible"] > 0
    days = 300e9 / ranged.scored.cols["tokens_per_s"][ranged.best] / 86400
    assert days <= 30


def test_a_range_scored_count_by_count_ranks_as_one_pass() -> None:
    targets = Targets(objectives=("throughput",))
    one = run_search(request(gpus=(1, 2, 4, 8), sampler="exhaustive", targets=targets))
    small = dataclasses.replace(one.request.space,
                                max_enumerate=one.request.largest_count_rows())
    assert small.max_enumerate < one.request.space_size()  # so the counts go one by one
    split = run_search(dataclasses.replace(one.request, space=small, space_given=small))
    assert split.sampler == "exhaustive"
    assert split.scored.counts == one.scored.counts and split.total == one.total
    a, b = one.scored.cols, split.scored.cols
    for k in ("num_gpus", "dp", "tp", "pp", "mbs", "zero_stage", "recompute"):
        assert a[k][one.best] == b[k][split.best]
    assert a["tokens_per_s"][one.best] == b["tokens_per_s"][split.best]


def test_gpus_objective_stops_at_the_first_count_that_meets_the_targets() -> None:
    res = run_search(request(gpus=(1, 2, 4, 8), sampler="exhaustive",
                             targets=Targets(objectives=("gpus",))))
    small = dataclasses.replace(res.request.space,
                                max_enumerate=res.request.largest_count_rows())
    assert small.max_enumerate < res.request.space_size()  # so the counts go one by one
    split = run_search(dataclasses.replace(res.request, space=small, space_given=small))
    c = split.scored.cols
    best = int(c["num_gpus"][split.best])
    assert best == int(res.scored.cols["num_gpus"][res.best])
    assert set(c["num_gpus"].tolist()) <= {n for n in (1, 2, 4, 8) if n <= best}
    # summary.json says which counts it scored, not only which were asked for
    data = summary(split, top=5)
    assert data["num_gpus"] == [1, 2, 4, 8]
    assert data["num_gpus_scored"] == [n for n in (1, 2, 4, 8) if n <= best] != [1, 2, 4, 8]
    assert summary(res, top=5)["num_gpus_scored"] == [1, 2, 4, 8]  # one pass scores all


def test_layouts_whose_dp_cannot_divide_the_batch_are_counted_exactly() -> None:
    req = request(gpus=(3, 6, 12), gbs=8)
    space, model = req.space, req.model
    enum = enumerate_space(space, model, req.gpu_counts, 8)
    lay, _ = layouts(space, req.gpu_counts)
    axes = _rest_axes(space, model)
    bad = lay[:, 8 % lay[1] != 0]
    joint = _joint(bad, space, model, (8, 8))
    rest = int(np.prod([len(v) for _, v in axes]))
    full = _materialize(joint, axes, np.arange(len(joint["dp"]) * rest), space, model)
    rule = first_rule(full, model)
    expect = {RULE_KEYS[r]: int((rule == r).sum()) for r in np.unique(rule)}
    assert enum.precounted == expect and sum(expect.values()) > 0


def test_batch_sizes_of_a_range() -> None:
    assert batch_sizes(1024, 4096, 96) == [1024, 1536, 2048, 3072, 4096]
    assert batch_sizes(16, 16, 3) == [16]
    for dp in (1, 3, 8, 12):
        got = batch_sizes(100, 5000, dp)
        assert all(100 <= g <= 5000 for g in got) and got == sorted(set(got))


def run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_batch_range_lets_the_search_pick_the_batch(capsys) -> None:
    argv = ["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
            "--space", "small-cpu", "--format", "json"]
    code, out, err = run(argv + ["--global-batch-size", "8..32"], capsys)
    assert code == 0, err
    data = json.loads(out)
    picked = data["best"]["batch"]["global_batch_size"]
    tried = {r["gbs"] for r in data["top"]}
    assert 8 <= picked <= 32 and picked % (data["best"]["parallel"]["dp"]
                                           * data["best"]["batch"]["micro_batch_size"]) == 0
    singles = []
    for gbs in (8, 16, 32):
        code, out, _ = run(argv + ["--global-batch-size", str(gbs)], capsys)
        singles.append(json.loads(out)["best"]["predicted"]["tokens_per_s"])
    assert data["best"]["predicted"]["tokens_per_s"] == pytest.approx(max(singles), rel=1e-12)
    assert tried <= {8, 16, 32}


@pytest.mark.parametrize("value", ["0", "9..3", "abc", "8..", "1..99999999999"])
def test_a_bad_batch_is_one_line(value: str, capsys) -> None:
    code, out, err = run(["search", "--model", "tiny", "--cluster", "cpu-gloo", "--num-gpus", "4",
                          "--global-batch-size", value], capsys)
    assert code == 2 and "--global-batch-size" in err and len(err.strip().splitlines()) == 1
