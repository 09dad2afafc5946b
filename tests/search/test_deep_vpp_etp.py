"""`vpp: auto` and `etp: auto` in the search spaces (issue #12 deliver 1, issue #13 deliver 3):
the spelling loads strictly; auto lists every vpp up to 8 and the deeper ones whose virtual
stages take a whole number of blocks, never one that leaves a virtual stage empty; MoE models
try expert TP 1 and = tp where the rules allow it, dense models etp 1 only; a deep-vpp plan
exports to Megatron with the flag Megatron's own parser and Megatron-Core accept."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Pipeline, Plan, Schedule
from autoplan.plan_rules import RULE_KEYS, validate_plan, violations, violations_of
from autoplan.plan_rules_moe import MOE_RULES
from autoplan.plan_table import INTERLEAVED, plan_to_row
from autoplan.search.derived import auto_vpp, expert_pairs
from autoplan.search.engine import run_search
from autoplan.search.partition import ends_lighter_layers
from autoplan.search.ranking import row_plan
from autoplan.search.space import enumerate_space, joint_rows, pipeline_shapes
from autoplan.search.trial_space import expert_choices
from autoplan.search_space import Split, load_space, space_from_dict
from tests.search.conftest import SMALL_SPACE, request
from tests.unit.export.consumers import megatron_parser, run_script

QWEN3 = PRESETS["qwen3-30b-a3b"]  # 48 layers: Megatron-Bridge runs it at PP2 x VP12 and VP24


def _space(**changes: object) -> dict:
    data = copy.deepcopy(SMALL_SPACE)
    for path, value in changes.items():
        section, _, name = path.rpartition("__")
        (data[section] if section else data)[name] = value
    return data


# --- the spelling -------------------------------------------------------------------------

def test_auto_loads_for_vpp_and_etp_and_summarises_as_spelled() -> None:
    space = space_from_dict(_space(pipeline__vpp="auto", parallel__etp="auto"))
    assert space.pipeline.vpp is None and space.parallel.etp is None
    summary = space.summary()
    assert summary["pipeline"]["vpp"] == "auto" and summary["parallel"]["etp"] == "auto"
    listed = space_from_dict(_space(pipeline__vpp=[1, 12], parallel__etp=[1, 2]))
    assert listed.pipeline.vpp == (1, 12) and listed.parallel.etp == (1, 2)


@pytest.mark.parametrize("path,value,expect", [
    ("pipeline__vpp", "automatic", "pipeline.vpp: got 'automatic'"),
    ("pipeline__vpp", None, "pipeline.vpp: got null"),
    ("pipeline__vpp", ["auto", 12], "write auto alone"),
    ("pipeline__vpp", [0, 2], "pipeline.vpp: got 0"),
    ("parallel__etp", "tp", "parallel.etp: got 'tp'"),
    ("parallel__etp", None, "parallel.etp: got null"),
    ("parallel__etp", [0], "parallel.etp: got 0"),
])
def test_bad_auto_values_are_one_line_errors(path: str, value: object, expect: str) -> None:
    with pytest.raises(ConfigError) as err:
        space_from_dict(_space(**{path: value}), "space x.yaml")
    text = str(err.value)
    assert expect in text and "\n" not in text
    assert "auto" in text  # the fix names the spelling


def test_the_shipped_spaces_use_auto() -> None:
    for name in ("default", "hsdp-bf16-reduce", "recompute-modules"):
        space = load_space(name)
        assert space.pipeline.vpp is None and space.parallel.etp is None, name
    # the model-free size still counts vpp 1..8 as before (deeper ones are the model's rows)
    assert load_space("default").knob_sizes()["vpp"] == 8


# --- vpp: auto ----------------------------------------------------------------------------

def _whole_blocks(layers: int, pp: int, vpp: int) -> bool:
    """Megatron-Core's --num-layers-per-virtual-pipeline-stage: the even split, or the ends
    split with the embedding and the loss counted as one layer each (every middle equal)."""
    plan = Plan(model="tiny", cluster=ClusterRef("cpu-gloo", pp), parallel=Parallel(pp=pp),
                pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, vpp=vpp),
                batch=Batch(micro_batch_size=1, global_batch_size=pp))
    model = dataclasses.replace(PRESETS["tiny"], num_layers=layers)
    even = not any("pp * pipeline.vpp" in r for r in validate_plan(plan, model))
    ends = ends_lighter_layers(layers, pp * vpp)
    return even or (ends is not None and len(set(ends[1:-1])) == 1 and ends[0] == ends[1] - 1)


@pytest.mark.parametrize("layers,pp", [(48, 2), (48, 4), (96, 2), (96, 16), (126, 4), (61, 4)])
def test_auto_vpp_is_every_vpp_to_8_and_deeper_whole_ones(layers: int, pp: int) -> None:
    got = set(auto_vpp(layers, pp))
    for vpp in range(1, layers + 1):
        fits = pp * vpp <= layers  # each virtual stage holds a block (rule pp-le-layers)
        expect = fits and (vpp <= 8 or _whole_blocks(layers, pp, vpp))
        assert (vpp in got) == expect, (layers, pp, vpp)


def test_qwen3_at_pp2_lists_vp12_and_vp24_and_no_empty_virtual_stage() -> None:
    space = load_space("default")
    assert {12, 24} <= set(auto_vpp(QWEN3.num_layers, 2))
    rows = pipeline_shapes(space, QWEN3, 2)
    vpps = set(rows[rows[:, 0] == INTERLEAVED, 1].tolist())
    assert {1, 2, 3, 4, 5, 6, 7, 8} - {1} <= vpps and {12, 24} <= vpps
    assert not vpps & {9, 10, 11, 13, 25, 48}  # no whole split (9..11, 13) or empty stages
    deep = rows[rows[:, 1] == 24]
    assert len(deep) and (deep[:, 3:6] == 24).all()  # 1 layer per virtual stage, 24 per rank
    assert (deep[:, 6] == 1).all()  # chunk_min
    # 96 layers on pp 16: 7 and 8 virtual stages per rank would leave stages empty
    assert auto_vpp(96, 16) == (1, 2, 3, 4, 5, 6) and auto_vpp(96, 1) == (1,)


def test_embedding_and_loss_stages_of_their_own_may_hold_no_block() -> None:
    """Llama 3.1 405B: 126 layers on pp 16 x vpp 8 = 128 virtual stages as Megatron-Core's
    "E|t|...|t|L": listed with the embed-loss split, and that plan passes the rules; the even
    split of the same shape still leaves two stages empty and is refused."""
    model = PRESETS["llama-3.1-405b"]
    assert 8 in auto_vpp(126, 16, ends_empty=True) and 8 not in auto_vpp(126, 16)
    plan = Plan(model="llama-3.1-405b", cluster=ClusterRef("h100-sxm-80gb", 1024),
                parallel=Parallel(dp=8, tp=8, pp=16), sequence_parallel=True,
                pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, vpp=8,
                                  layers_per_stage=(0, *(1,) * 126, 0)),
                batch=Batch(micro_batch_size=1, global_batch_size=128), zero_stage=1)
    assert not validate_plan(plan, model)
    even = dataclasses.replace(plan, pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, vpp=8))
    assert any("exceeds num_layers=126" in r for r in validate_plan(even, model))
    # the search's rows of that shape: the embed-loss one passes the layer rules, the even not
    rows = pipeline_shapes(load_space("default"), model, 16)
    rows = rows[rows[:, 1] == 8]
    table = {k: np.full(len(rows), v) for k, v in plan_to_row(plan, model).items()}
    table.update(schedule=rows[:, 0], split=rows[:, 2], layers_first=rows[:, 3],
                 layers_max=rows[:, 4], layers_last=rows[:, 5])
    bad = violations(table, model)[:, RULE_KEYS.index("pp-le-layers")]
    embed_loss = rows[:, 2] == list(Split).index(Split.EMBED_LOSS)
    assert embed_loss.any() and (bad == ~embed_loss).all()


def test_deep_vpp_rows_pass_the_layer_rules_and_are_counted() -> None:
    space = space_from_dict(_space(parallel={"dp": None, "tp": [1], "pp": [2], "cp": [1]},
                                   pipeline={"schedule": ["interleaved-1f1b"], "vpp": "auto"}))
    req = request(space, model="qwen3-30b-a3b", cluster="h100-sxm-80gb", gpus=(16,), gbs=512)
    enum = enumerate_space(req.space, req.model, req.gpu_counts, 512)
    t = enum.table
    assert len(t["dp"]) == joint_rows(req.space, req.model, req.gpu_counts, req.batch)
    assert {12, 24} <= set(np.unique(t["vpp"]).tolist())
    assert (t["pp"] * t["vpp"] <= QWEN3.num_layers).all()


# --- etp: auto ----------------------------------------------------------------------------

def test_a_dense_model_gets_no_etp_above_1() -> None:
    space = load_space("default")
    for tp in (1, 2, 4, 8):
        assert expert_pairs(space, PRESETS["llama-3-8b"], tp, 8 * tp) == [(1, 1)]
    req = request(_space(parallel__etp="auto"), model="tiny", gpus=(4,))
    enum = enumerate_space(req.space, req.model, req.gpu_counts, 8)
    assert (enum.table["etp"] == 1).all() and (enum.table["tp"] > 1).any()


def test_a_moe_model_gets_etp_equal_to_tp_where_the_rules_allow() -> None:
    space = load_space("default")
    mixtral = PRESETS["mixtral-8x7b"]
    for tp, group in ((1, 8), (2, 16), (4, 64), (8, 64)):
        pairs = expert_pairs(space, mixtral, tp, group)
        assert {t for _, t in pairs} == {1, tp}
        ep, etp = np.array(pairs).T
        table = {"dp": np.full(len(ep), group // tp), "cp": np.ones_like(ep),
                 "tp": np.full(len(ep), tp), "ep": ep, "etp": etp}
        assert not violations_of(MOE_RULES, table, mixtral).any()
    # a layout whose dp * cp * tp = 16 at tp 8 leaves ep 1 and 2 for etp 8 (8 * ep divides 16)
    assert [e for e, t in expert_pairs(space, mixtral, 8, 16) if t == 8] == [1, 2]


def test_etp_equal_to_tp_plans_are_searched_and_valid() -> None:
    space = _space(parallel={"dp": None, "tp": [1, 2], "pp": [1], "cp": [1], "etp": "auto"},
                   precision="bf16")
    req = request(space, model="tiny-moe", cluster="h100-sxm-80gb", gpus=(8,), gbs=16)
    res = run_search(req)
    c = res.scored.cols
    rows = res.order
    assert set(np.unique(c["etp"][rows]).tolist()) == {1, 2}
    assert (c["etp"][rows][c["tp"][rows] == 1] == 1).all()
    assert ((c["etp"][rows] == 1) | (c["etp"][rows] == c["tp"][rows])).all()
    i = int(rows[np.flatnonzero(c["etp"][rows] == 2)[0]])
    plan = row_plan(res.scored, i, req.model, "tiny-moe", "h100-sxm-80gb", req.space,
                    req.targets)
    assert plan.parallel.etp == plan.parallel.tp == 2 and not validate_plan(plan, req.model)
    # an Optuna trial settles the same pairs inside the layout
    layout = {"dp": 4, "tp": 2, "cp": 1}
    assert {t for _, t in expert_choices(layout, req)} == {1, 2}


# --- export of a deep-vpp plan -------------------------------------------------------------

def _qwen3_plan(vpp: int) -> Plan:
    return Plan(model="qwen3-30b-a3b", cluster=ClusterRef("h100-sxm-80gb", 16),
                parallel=Parallel(dp=8, pp=2, ep=8),
                pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, vpp=vpp),
                batch=Batch(micro_batch_size=1, global_batch_size=1024), zero_stage=1)


@pytest.mark.parametrize("vpp,per_stage", [(12, 2), (24, 1)])
def test_a_deep_vpp_plan_exports_to_megatron(tmp_path: Path, vpp: int, per_stage: int) -> None:
    plan = _qwen3_plan(vpp)
    assert not validate_plan(plan, QWEN3)
    files = export_plan(get_target("megatron"), plan, QWEN3, ExportOptions(gpus_per_node=8))
    path = tmp_path / "megatron_args.sh"
    path.write_text(files["megatron_args.sh"])
    [call] = run_script(path, {"torchrun": ""})
    ns = megatron_parser().parse_args(call[call.index("pretrain_gpt.py") + 1:])
    assert ns.num_layers_per_virtual_pipeline_stage == per_stage
    assert ns.num_virtual_stages_per_pipeline_rank is None
    assert ns.pipeline_model_parallel_layout is None
    per_rank = ns.num_layers // ns.pipeline_model_parallel_size  # as validate_args derives it
    assert per_rank // ns.num_layers_per_virtual_pipeline_stage == vpp
    pytest.importorskip("megatron.core")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from megatron.core.transformer import TransformerConfig
        assert ns.bf16  # megatron.training sets both dtypes from --bf16
        config = TransformerConfig(
            bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
            expert_tensor_parallel_size=ns.expert_tensor_parallel_size,
            num_layers=ns.num_layers, hidden_size=ns.hidden_size,
            num_attention_heads=ns.num_attention_heads, num_query_groups=ns.num_query_groups,
            pipeline_model_parallel_size=ns.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=vpp, num_moe_experts=ns.num_experts,
            moe_ffn_hidden_size=ns.moe_ffn_hidden_size, moe_router_topk=ns.moe_router_topk,
            expert_model_parallel_size=ns.expert_model_parallel_size,
            kv_channels=ns.kv_channels)
    assert config.virtual_pipeline_model_parallel_size == vpp


def test_deepspeed_refuses_a_deep_vpp_plan_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        export_plan(get_target("deepspeed"), _qwen3_plan(12), QWEN3,
                    ExportOptions(gpus_per_node=8))
    assert "vpp=12" in str(err.value) and "\n" not in str(err.value)


def test_the_splits_read_the_layer_graphs_path() -> None:
    """The balanced split and the heaviest-rank load read the block FLOPs as arrays: the
    same numbers as layer_graph's nodes along its path, embedding first and head last."""
    import networkx as nx

    from autoplan.search.partition import _block_weights, _path_flops, layer_graph

    model = PRESETS["llama-3-8b"]
    g = layer_graph(model)
    order = list(nx.topological_sort(g))
    flops = [g.nodes[n]["flops"] for n in order]
    blocks, embed, head = _path_flops(model)
    assert blocks.tolist() == flops[1:-1] and (embed, head) == (flops[0], flops[-1])
    folded = _block_weights(model)
    assert folded[0] == flops[0] + flops[1] and folded[-1] == flops[-2] + flops[-1]
    assert folded[1:-1].tolist() == flops[2:-2]


def test_torchtitan_maps_a_deep_vpp_plan_to_one_model_part_per_virtual_stage() -> None:
    """torchtitan without module parts would run 2 stages per rank for Interleaved1F1B; the
    export names each of the pp * vpp parts (Llama 3 8B on pp 2 x vpp 16: one block each)."""
    from autoplan.export.torchtitan import settings

    plan = Plan(model="llama-3-8b", cluster=ClusterRef("h100-sxm-80gb", 16),
                parallel=Parallel(dp=8, pp=2), zero_stage=2,
                pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, vpp=16),
                batch=Batch(micro_batch_size=1, global_batch_size=1024))
    export_plan(get_target("torchtitan"), plan, plan.model_spec(), ExportOptions(gpus_per_node=8))
    par = settings(plan, plan.model_spec(), "python")["parallelism"]
    parts = par["module_fqns_per_model_part"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and len(parts) == 32
    assert [sum(f.startswith("layers.") for f in p) for p in parts] == [1] * 32
