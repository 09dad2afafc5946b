"""Communication terms against hand-computed values."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autoplan.cost import comm
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS


def _flat_profile():
    """h100 links at their datasheet bandwidth (no message-size efficiency curve)."""
    prof = load_profile("h100-sxm-80gb")
    eff = dataclasses.replace(prof.efficiency, intra_node=None, inter_node=None)
    return dataclasses.replace(prof, efficiency=eff)


def test_context_parallel_is_one_kv_all_gather_and_one_reduce_scatter_exposed() -> None:
    """Llama-3-8B (8 kv heads of 128), s = 8192, b = 1, bf16, cp = 4 inside a node: K and V of
    the whole sequence are 2 * 2 B * 8192 * 1024 = 32 MiB; a ring all-gather and a
    reduce-scatter each take 3 latencies + 3/4 of that over the link; nothing hides them."""
    prof, m = _flat_profile(), PRESETS["llama-3-8b"]
    assert (m.kv_heads, m.head_dim, m.seq_len) == (8, 128, 8192)
    kv_all = 2 * 2 * 8192 * 8 * 128
    one = 3 * prof.intra_node.latency_s + 0.75 * kv_all / prof.intra_node.bytes_per_s

    def t(cp, tp=1, **kw):
        return float(comm.context_parallel_time_s(m, np.array(1.0), np.array(float(tp)),
                                                  np.array(float(cp)), 2.0, np.array(True), prof,
                                                  **kw))

    assert t(4) == pytest.approx(2 * one, rel=1e-12)
    assert t(4, recompute_gathers=1.0) == pytest.approx(3 * one, rel=1e-12)
    assert t(1) == 0.0
    # tp splits the kv heads, so each cp collective carries 1/tp of the bytes
    half = 3 * prof.intra_node.latency_s + 0.75 * kv_all / 2 / prof.intra_node.bytes_per_s
    assert t(4, tp=2) == pytest.approx(2 * half, rel=1e-12)


def test_context_parallel_gathers_kv_heads_not_query_heads() -> None:
    prof = _flat_profile()
    gqa = PRESETS["llama-3-8b"]
    mha = gqa.replace(num_kv_heads=gqa.num_heads)
    args = (np.array(1.0), np.array(1.0), np.array(8.0), 2.0, np.array(True), prof)
    lat = 2 * 7 * prof.intra_node.latency_s
    ratio = (comm.context_parallel_time_s(mha, *args) - lat) / (
        comm.context_parallel_time_s(gqa, *args) - lat)
    assert float(ratio) == pytest.approx(gqa.num_heads / gqa.kv_heads, rel=1e-9)


def _tabled(per_call_s: float, slots: int | None = 2):
    """cpu-gloo with measured tables: a fixed cost per call and 1 GB/s beyond it, and no DTensor
    excess per call (tp_collective_overhead_s: test_tp_collective_overhead.py adds it)."""
    from autoplan.hardware import CollectiveTimes, TimeTable

    xs = (1024.0, 2.0**20, 2.0**24)
    table = {g: TimeTable(xs, tuple(per_call_s * g + x / 1e9 for x in xs)) for g in (2, 4)}
    prof = load_profile("cpu-gloo")
    host = dataclasses.replace(prof.host, compute_slots=slots)
    eff = dataclasses.replace(prof.efficiency, tp_collective_overhead_s=0.0)
    return dataclasses.replace(prof, host=host, efficiency=eff, collectives=CollectiveTimes(
        all_reduce=table, all_gather=table, reduce_scatter=table))


def test_measured_tables_replace_the_ring_formula_for_measured_groups() -> None:
    prof = _tabled(1e-3, slots=None)
    inside = np.array([True, True, True, False])
    sizes = np.array([2, 4, 8, 2])
    t = comm.collective_time_s(comm.ALL_REDUCE, np.full(4, 2.0**20), sizes, inside, prof)
    ring = comm.collective_time_s(comm.ALL_REDUCE, np.full(4, 2.0**20), sizes, inside,
                                  dataclasses.replace(prof, collectives=None))
    assert t[0] == pytest.approx(2e-3 + 2.0**20 / 1e9)
    assert t[1] == pytest.approx(4e-3 + 2.0**20 / 1e9)
    assert t[2] == ring[2] and t[3] == ring[3]  # no table for 8 ranks; across nodes: formula


def test_a_table_measured_on_shared_cores_is_not_slowed_twice() -> None:
    """A 4-rank table taken on 2 cores already holds the 2x time-sharing that estimate_table
    applies to the whole step; comm divides it out."""
    t = comm.collective_time_s(comm.ALL_REDUCE, np.array([1024.0]), np.array([4]),
                               np.array([True]), _tabled(1e-3, slots=2))
    assert t[0] == pytest.approx((4e-3 + 1024 / 1e9) / 2)


def test_time_table_extends_past_its_largest_size_at_the_last_bandwidth() -> None:
    from autoplan.hardware import TimeTable

    table = TimeTable((1e3, 1e6), (1e-6, 2e-3))
    slope = (2e-3 - 1e-6) / (1e6 - 1e3)  # steeper than the 2e-9 s/B average: it is used
    assert table(np.array([2e6]))[0] == pytest.approx(2e-3 + 1e6 * slope)
    assert table(np.array([1e3, 1e6]))[1] == pytest.approx(2e-3)
    assert 1e-6 < table(np.array([3e4]))[0] < 2e-3  # log-log inside
    # a cleaned table can end flat; past it, time grows at the last rising segment's rate
    flat = TimeTable((1024.0, 4096.0, 16384.0), (2e-4, 2.5e-4, 2.5e-4))
    x = 2.0**30
    assert flat(np.array([x]))[0] == pytest.approx(2.5e-4 + (x - 16384) * 5e-5 / 3072)


def test_sequence_parallel_doubles_the_calls_of_tensor_parallelism() -> None:
    """Same bytes, twice the collectives: where each call costs a fixed time, SP's block
    communication costs twice plain TP's (measured on the runtime: 4 all-reduces vs 4
    all-gathers + 4 reduce-scatters per block and micro-batch)."""
    prof = _tabled(1e-3, slots=None)
    model = PRESETS["tiny"]
    args = (np.array([1024.0]), np.array([256.0]), np.array([2.0]))
    plain = comm.tensor_parallel_time_s(model, *args, np.array([False]), np.array([True]), prof)
    sp = comm.tensor_parallel_time_s(model, *args, np.array([True]), np.array([True]), prof)
    assert sp["layer"][0] == pytest.approx(2.0 * plain["layer"][0])
    assert plain["norm_grad"][0] == 0.0
    # one partial norm-gradient sum: h floats, below the table's smallest size, which prices it
    assert sp["norm_grad"][0] == pytest.approx(2e-3 + 1024 / 1e9)
    assert plain["recompute_selective"][0] == 0.0 and sp["recompute_selective"][0] > 0.0


def test_time_table_rejects_times_that_fall_with_size() -> None:
    from autoplan.errors import ConfigError
    from autoplan.hardware import TimeTable

    with pytest.raises(ConfigError, match="do not fall"):
        TimeTable((1e3, 1e6), (2e-4, 1e-4))


def _a100_flat():
    """a100 links at their datasheet bandwidth: NVLink 300 GB/s per GPU, one 25 GB/s NIC per GPU,
    so a node's eight NICs (200 GB/s) are slower than one GPU's NVLink."""
    prof = load_profile("a100-sxm4-80gb")
    eff = dataclasses.replace(prof.efficiency, intra_node=None, inter_node=None)
    return dataclasses.replace(prof, efficiency=eff)


def _time(kind, nbytes, n, g, prof):
    return float(comm.collective_time_s(kind, np.array([nbytes]), np.array([float(n)]),
                                        np.array([n <= g]), prof,
                                        per_node=np.array([float(g)]))[0])


@pytest.mark.parametrize("kind", [comm.ALL_GATHER, comm.REDUCE_SCATTER])
def test_across_nodes_a_ring_runs_at_the_nodes_nic_aggregate(kind):
    """2 nodes x 8 GPUs, 1 GB: NCCL's ring keeps every hop busy, so the node's eight NICs
    (8 x 25 GB/s, below NVLink's 300) set the bus bandwidth, as nccl-tests measures across
    nodes; latency: 14 steps inside a node and 1 across (NCCL's tuning model)."""
    prof, m = _a100_flat(), 1e9
    want = 15 / 16 * m / (8 * 25e9) + 14 * 5e-6 + 1 * 10e-6
    assert _time(kind, m, 16, 8, prof) == pytest.approx(want, rel=1e-12)


def test_one_rank_per_node_rings_through_its_own_nic():
    """A group with one GPU per node (dp across tp-filled nodes) runs at one NIC's bandwidth."""
    prof, m = _a100_flat(), 1e9
    want = 63 / 64 * m / 25e9 + 63 * 10e-6
    assert _time(comm.ALL_GATHER, m, 64, 1, prof) == pytest.approx(want, rel=1e-12)


def test_all_reduce_across_nodes_takes_the_faster_of_ring_and_tree():
    """Large: the ring (2 x the all-gather's bus traffic at the NICs' aggregate). Small: the
    hierarchical reduction with the double binary tree's 2 log2 k inter-node hops, far fewer
    than the ring's 2(n-1) steps."""
    prof = _a100_flat()
    big = _time(comm.ALL_REDUCE, 1e9, 16, 8, prof)
    assert big == pytest.approx(2 * 15 / 16 * 1e9 / 200e9 + 28 * 5e-6 + 2 * 10e-6, rel=1e-12)
    small = _time(comm.ALL_REDUCE, 1024.0, 512, 8, prof)
    tree = (2 * 7 / 8 * 1024 / 300e9 + 14 * 5e-6
            + 2 * 63 / 64 * 1024 / (8 * 25e9) + 2 * 6 * 10e-6)
    assert small == pytest.approx(tree, rel=1e-12)
    assert small < 2 * 511 * 5e-6  # a ring's steps alone would take longer


def test_torch_ring_hides_its_gather_behind_the_first_step_only() -> None:
    """PyTorch's ring attention (rotate_method ALL_GATHER): the K/V all-gather waits at step 1,
    so only the first step's kernel covers it, forward and backward; backward passes fp32
    dK/dV (twice the 16-bit chunk) to the next rank after every step, the last one exposed."""
    prof = _flat_profile()
    kv, cp, inside = np.array(64.0 * 2**20), np.array(4.0), np.array(True)
    gather = float(comm.collective_time_s(comm.ALL_GATHER, kv, cp, inside, prof))
    shift = float(comm.p2p_time_s(2.0 * kv / 4.0, inside, prof))

    def ring(step_f, step_b, n=cp):
        out = comm.torch_ring_time_s(kv, n, np.array(step_f), np.array(step_b), inside, prof)
        return float(out["forward"]), float(out["backward"])

    # steps longer than every exchange: only the last dK/dV shift is left exposed
    assert ring(1.0, 1.0) == (0.0, pytest.approx(shift, rel=1e-12))
    # instant steps: everything exposed, the gather twice and all cp shifts
    f, b = ring(0.0, 0.0)
    assert f == pytest.approx(gather, rel=1e-12)
    assert b == pytest.approx(gather + 4 * shift, rel=1e-12)
    # a step shorter than the gather leaves the rest of it exposed
    f, _ = ring(gather / 4.0, 1.0)
    assert f == pytest.approx(0.75 * gather, rel=1e-12)
    assert ring(0.0, 0.0, n=np.array(1.0)) == (0.0, 0.0)


def test_a_collectives_table_of_one_size_is_refused() -> None:
    """One measured size priced every message the same (1 KiB and 1 GiB alike)."""
    from autoplan.errors import ConfigError
    from autoplan.hardware import TimeTable

    with pytest.raises(ConfigError, match="at least two message sizes"):
        TimeTable((1024.0,), (1e-4,))
