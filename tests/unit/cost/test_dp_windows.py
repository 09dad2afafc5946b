"""What the data-parallel (ZeRO) collectives hide behind (cost/dp_comm.py, _zero_traffic and
_beside_s): a pass's compute and, for a group that crosses the network, the exposed
tensor-parallel collectives and expert all-to-alls that stay on NVLink inside a node; and the
forward/backward split of those seconds (cost/stage_time.py, stage_s)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import block_time, dp_comm, stage_time, step_memory, step_time
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Recompute, RecomputePolicy
from autoplan.plan_table import plan_to_row

H100 = load_profile("h100-sxm-80gb")  # 8 GPUs a node
MEGATRON = load_runtime("megatron")


def _rows(model: str, gpus: int, zero: int = 1, recompute: str = "none", **par):
    spec = PRESETS[model]
    plan = Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus), parallel=Parallel(**par),
                sequence_parallel=par.get("tp", 1) > 1,
                batch=Batch(micro_batch_size=1, global_batch_size=4 * par.get("dp", 1)),
                zero_stage=zero, recompute=Recompute(policy=RecomputePolicy(recompute)))
    return rows_of(plan_to_row(plan, spec), spec, "bf16", MEGATRON), spec


def _crit(tp: float = 0.0, tp_forward: float = 0.0, ep: float = 0.0, ep_forward: float = 0.0
          ) -> dict[str, np.ndarray]:
    """A stage of 0.1 s forward and 0.2 s backward compute per micro-batch with the given
    exposed collectives."""
    one = np.ones(1)
    return {"forward": 0.1 * one, "backward": 0.2 * one, "recompute": 0.0 * one,
            "tp": tp * one, "tp_forward": tp_forward * one, "ep": ep * one,
            "ep_forward": ep_forward * one}


def _windows(r, crit, psi=1e9, size=None, stride=None) -> tuple[float, float]:
    t = dp_comm._zero_traffic(H100, r, MEGATRON, crit, np.full(1, psi),
                                r.shard if size is None else size,
                                r.tp if stride is None else stride)
    return float(t.gather_window[0]), float(t.reduction_window[0])


def test_a_group_across_nodes_also_hides_behind_tensor_parallel_collectives_on_nvlink():
    """dp 8 x tp 8 on 64 GPUs: the ZeRO-1 group (one rank a node) crosses the network while
    each node's tp 8 all-gathers and reduce-scatters on NVLink; the once-a-step gather hides
    behind the forward's wall time, its compute (stretched by the slowdown) and its exposed
    TP seconds (not stretched: no compute beside them to slow), the reduction behind the
    backward's."""
    r, _ = _rows("llama-3-70b", 64, dp=8, tp=8)
    bare_g, bare_r = _windows(r, _crit())
    g, red = _windows(r, _crit(tp=0.06, tp_forward=0.025))
    overlap = H100.efficiency.overlap
    assert bare_g == pytest.approx(0.1 * overlap * (1 + H100.efficiency.comm_slowdown))
    assert g - bare_g == pytest.approx(0.025 * overlap)
    assert red - bare_r == pytest.approx((0.06 - 0.025) * overlap)


def test_a_group_inside_a_node_shares_the_links_and_hides_behind_compute_alone():
    """dp 4 x tp 2 on one 8-GPU node: the ZeRO group's collectives run on the same NVLink as
    the TP ones, so the TP seconds are no window for them."""
    r, _ = _rows("llama-3.1-8b", 8, dp=4, tp=2)
    assert _windows(r, _crit(tp=0.06, tp_forward=0.025)) == pytest.approx(_windows(r, _crit()))


def test_tensor_parallel_collectives_that_cross_nodes_hide_nothing():
    """tp 16 spans two nodes: its collectives use the network the ZeRO group needs."""
    r, _ = _rows("llama-3-70b", 64, dp=4, tp=16)
    assert _windows(r, _crit(tp=0.06, tp_forward=0.025)) == pytest.approx(_windows(r, _crit()))


def test_expert_all_to_alls_inside_a_node_are_a_window_those_across_nodes_are_not():
    """The routed experts' own ZeRO group (ep x etp apart) crosses nodes in both layouts; the
    expert all-to-all is a window for it only where the EP group fits in a node (ep 8 of 8
    GPUs a node), not where it crosses the network itself (ep 16)."""
    crit, bare = _crit(ep=0.08, ep_forward=0.04), _crit()
    for ep, beside in ((8, True), (16, False)):
        r, _ = _rows("mixtral-8x7b", 64, dp=64, ep=ep)
        got = _windows(r, crit, size=r.expert_shard, stride=r.ep * r.etp)
        base = _windows(r, bare, size=r.expert_shard, stride=r.ep * r.etp)
        if beside:
            assert got[0] - base[0] == pytest.approx(0.04 * H100.efficiency.overlap)
        else:
            assert got == pytest.approx(base)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_a_stage_runs_half_its_block_collectives_forward_and_its_recompute_s_backward(recompute):
    """Each block's TP collectives come in forward/backward pairs (Megatron's f and g), and
    full recompute runs its re-run's collectives inside backward: the forward share of the
    exposed TP seconds is half without recompute and less than half with it."""
    r, spec = _rows("llama-3-70b", 8, recompute=recompute, tp=8)
    priced = step_time.priced_profile(H100, MEGATRON)
    parts = step_memory.activation_parts(spec, r, False, MEGATRON, "bf16")
    c = block_time.block_costs(spec, priced, r, "bf16", False, MEGATRON, parts)
    zero = 0.0 * r.layers_max
    stage = stage_time.stage_s(c, r, priced, MEGATRON, np.array([10.0]), zero, zero)
    tp, forward = float(stage["tp"][0]), float(stage["tp_forward"][0])
    assert tp > 0.0
    if recompute == "none":
        assert forward == pytest.approx(tp / 2.0)
    else:
        assert 0.0 < forward < tp / 2.0


def test_the_qwen3_fsdp_row_hides_its_expert_collectives_behind_the_all_to_alls():
    """Qwen3-235B with Megatron-FSDP over 128 ranks and EP 8 inside each node (the Model Zoo's
    "intra-node EP" row): the experts' gathers and reductions (one rank a node) outlast the
    compute, and the intra-node all-to-alls beside them leave less of them exposed than the
    compute alone would."""
    spec = PRESETS["qwen3-235b-a22b"]
    rt = load_runtime("megatron-deepep")
    plan = Plan(model="qwen3-235b-a22b", cluster=ClusterRef("h100-sxm-80gb", 256),
                parallel=Parallel(dp=128, tp=2, ep=8), sequence_parallel=True,
                batch=Batch(micro_batch_size=4, global_batch_size=2048), zero_stage=3,
                recompute=Recompute(policy=RecomputePolicy.FULL))
    r = rows_of(plan_to_row(plan, spec), spec, "bf16", rt)
    parts = step_memory.activation_parts(spec, r, False, rt, "bf16")
    priced = step_time.priced_profile(H100, rt)
    crit = stage_time.critical_stage_s(spec, priced, r, "bf16", False, rt, parts)
    assert float(crit["ep"][0]) > 0.0
    psi = np.full(1, 4e9)
    with_beside = float(dp_comm._dp_comm(priced, r, rt, crit, psi, psi * 7)[0])
    alone = dict(crit, ep_forward=0.0 * crit["ep"], ep=0.0 * crit["ep"],
                 tp_forward=0.0 * crit["tp"], tp=0.0 * crit["tp"])
    without = float(dp_comm._dp_comm(priced, r, rt, alone, psi, psi * 7)[0])
    assert with_beside < without


def test_what_hides_beside_nvlink_collectives_slows_no_compute():
    """The compute slowdown a hidden collective costs (comm.contention_s) is charged on the
    compute share of its window only: beside a pass's NVLink collectives no compute runs.
    dp 8 x tp 8 on 64 GPUs: the forward window is 0.1 s of compute stretched by the slowdown
    and 0.025 s of TP collectives, the backward's 0.2 s and 0.035 s; inside one node the
    windows are compute alone."""
    s, overlap = H100.efficiency.comm_slowdown, H100.efficiency.overlap
    r, _ = _rows("llama-3-70b", 64, dp=8, tp=8)
    t = dp_comm._zero_traffic(H100, r, MEGATRON, _crit(tp=0.06, tp_forward=0.025),
                              np.full(1, 1e9), r.shard, r.tp)
    fwd, bwd = 0.1 * overlap * (1 + s), 0.2 * overlap * (1 + s)
    assert float(t.gather_compute_share[0]) == pytest.approx(fwd / (fwd + 0.025 * overlap))
    assert float(t.reduction_compute_share[0]) == pytest.approx(bwd / (bwd + 0.035 * overlap))
    inside, _ = _rows("llama-3.1-8b", 8, dp=4, tp=2)
    t = dp_comm._zero_traffic(H100, inside, MEGATRON, _crit(tp=0.06, tp_forward=0.025),
                              np.full(1, 1e9), inside.shard, inside.tp)
    assert float(t.gather_compute_share[0]) == 1.0
    assert float(t.reduction_compute_share[0]) == 1.0
