"""HSDP shard groups (parallel.dp_shard) and the gradient reduce dtype as search knobs: the
default space leaves both at null (its size and speed unchanged), the opt-in space
hsdp-bf16-reduce lists them, and the search emits only plans the rules and the runtime accept."""

from __future__ import annotations

import copy

import numpy as np

from autoplan.plan import ReduceDtype
from autoplan.plan_rules import runtime_limits, validate_plan
from autoplan.plan_table import REDUCE_DTYPES
from autoplan.search.engine import run_search
from autoplan.search.ranking import row_plan
from autoplan.search_space import load_space
from tests.search.conftest import SMALL_SPACE, request

SPACE = copy.deepcopy(SMALL_SPACE)
SPACE["parallel"] = {"dp": None, "tp": [1, 2], "pp": [1], "cp": [1], "dp_shard": [None, 2, 8]}
SPACE["zero_stage"] = [0, 3]
SPACE["grad_reduce_dtype"] = [None, "bf16"]


def test_default_space_keeps_both_knobs_at_the_runtime_default() -> None:
    default = load_space("default")
    assert default.parallel.dp_shard == (None,) and default.grad_reduce_dtype == (None,)
    opt_in = load_space("hsdp-bf16-reduce")
    assert opt_in.parallel.dp_shard == (None, 8)
    assert opt_in.grad_reduce_dtype == (None, ReduceDtype.BF16)
    assert opt_in.size() == 4 * default.size()


def _search(precision: str):
    space = {**SPACE, "precision": precision}
    req = request(space, model="tiny", cluster="a100-sxm4-80gb", gpus=(16,), gbs=32)
    return req, run_search(req)


def test_hsdp_and_bf16_reduce_are_searched_and_their_plans_valid() -> None:
    req, res = _search("bf16")
    c, counts = res.scored.cols, res.scored.counts
    assert counts["dp-shard-needs-zero"] > 0  # ZeRO-0 with a shard group is refused
    assert counts["dp-shard-divides-dp"] > 0  # dp_shard 8 at tp 2 (dp 8) is not below dp
    rows = res.order
    hsdp = rows[(c["dp_shard"][rows] == 2)]
    bf16 = rows[c["grad_reduce"][rows] == REDUCE_DTYPES.index(ReduceDtype.BF16)]
    assert len(hsdp) and len(bf16)
    assert np.all(c["zero_stage"][hsdp] == 3)
    for i in (hsdp[0], bf16[0]):
        plan = row_plan(res.scored, int(i), req.model, "tiny", "a100-sxm4-80gb", req.space,
                        req.targets)
        assert plan.parallel.dp_shard in (None, 2)
        assert not validate_plan(plan, req.model) and not runtime_limits(plan, req.model)
    # at equal layout, bf16 reduction moves half the bytes: never slower
    same = {k: c[k][rows] for k in ("dp", "tp", "zero_stage", "dp_shard", "mbs", "sp",
                                     "recompute", "recompute_layers", "attention")}
    keys = np.stack(list(same.values()), axis=1)
    for i, key in enumerate(keys):
        twin = np.flatnonzero((keys == key).all(axis=1) & (c["grad_reduce"][rows]
                                                             != c["grad_reduce"][rows][i]))
        if twin.size:
            fast, slow = sorted((i, int(twin[0])), key=lambda j: -c["grad_reduce"][rows][j])
            assert c["time_step"][rows][fast] <= c["time_step"][rows][slow]
            break
    else:
        raise AssertionError("no plan appeared with both reduce dtypes")


def test_bf16_reduce_under_fp32_is_counted_never_ranked() -> None:
    _, res = _search("fp32")
    c = res.scored.cols
    assert res.scored.counts["precision-unsupported"] > 0
    assert not np.any(c["grad_reduce"][res.order] == REDUCE_DTYPES.index(ReduceDtype.BF16))


def test_default_space_summary_is_unchanged_by_the_knobs() -> None:
    """Stored Optuna studies are keyed by the space's summary: a space that leaves both knobs
    at null summarises without them."""
    default = load_space("default").summary()
    assert "grad_reduce_dtype" not in default and "dp_shard" not in default["parallel"]
    opt_in = load_space("hsdp-bf16-reduce").summary()
    assert opt_in["grad_reduce_dtype"] == [None, "bf16"]
    assert opt_in["parallel"]["dp_shard"] == [None, 8]


def test_tpe_trials_settle_hsdp_and_reduce_inside_the_trial() -> None:
    """An Optuna trial scores every dp_shard x reduce dtype of its layout (the inner knobs) and
    keeps the fastest that fits: bf16 reduction, never slower, is what it keeps."""
    from autoplan.search.trial_space import variants

    req, _ = _search("bf16")
    layout = {"num_gpus": 16, "dp": 16, "tp": 1, "pp": 1, "cp": 1, "vpp": 1, "schedule": 1,
              "split": 0, "mbs": 1, "precision": 0, "attention": 0, "gbs": 32,
              "layers_first": 4, "layers_max": 4, "layers_last": 4, "chunk_min": 4}
    table = variants(layout, req)
    assert set(np.unique(table["dp_shard"])) == {0, 2, 8}
    assert set(np.unique(table["grad_reduce"])) == {0, REDUCE_DTYPES.index(ReduceDtype.BF16)}
    from autoplan.search.trial_space import evaluate

    rec = evaluate(layout, req)
    assert rec["grad_reduce"] == REDUCE_DTYPES.index(ReduceDtype.BF16)


def test_search_for_a_runtime_keeps_to_what_it_runs() -> None:
    """`search --runtime torchtitan` never ranks a bf16 reduce (torchtitan reduces in float32
    only) and `--runtime deepspeed` never an HSDP plan (DeepSpeed has none): their winners
    export (export/torchtitan.py, export/deepspeed.py refuse those)."""
    from autoplan.cost.runtimes import load_runtime

    for name, column, code in (("torchtitan", "grad_reduce", REDUCE_DTYPES.index(
            ReduceDtype.BF16)), ("deepspeed", "dp_shard", 2)):
        space = {**SPACE, "precision": "bf16", "zero_stage": [0, 2, 3]}
        req = request(space, model="tiny", cluster="a100-sxm4-80gb", gpus=(16,), gbs=32,
                      runtime=load_runtime(name))
        res = run_search(req)
        c = res.scored.cols
        assert len(res.order) and res.scored.counts["runtime-unsupported"] > 0
        assert not np.any(c[column][res.order] == code), name


def test_tables_show_the_shard_group_and_the_reduce_dtype(space_file, capsys,
                                                          monkeypatch) -> None:
    """A search table shows HSDP as dp/shard and the reduce dtype beside the precision, and
    its legend says what they mean; plans without them render as before."""
    from autoplan.commands import main
    from autoplan.search.rows import dp_cell, precision_cell

    assert dp_cell({"dp": 16, "dp_shard": 2}) == "16/2" and dp_cell({"dp": 16}) == "16"
    assert precision_cell({"precision": "bf16", "grad_reduce": "bf16"}) == "bf16 rbf16"
    assert precision_cell({"precision": "bf16", "grad_reduce": ""}) == "bf16"
    monkeypatch.setenv("COLUMNS", "200")  # room for the precision column
    path = space_file({**SPACE, "precision": "bf16", "parallel": {**SPACE["parallel"],
                                                                  "tp": [1]}})
    code = main(["search", "--model", "tiny", "--cluster", "a100-sxm4-80gb", "--num-gpus", "16",
                 "--global-batch-size", "32", "--space", str(path), "--format", "table",
                 "--top", "40"])
    text = capsys.readouterr().out
    assert code == 0
    assert "16/2" in text and "rbf16" in text, text
    assert "HSDP, ZeRO shard groups of S" in text and "rX = gradients reduced in X" in text
