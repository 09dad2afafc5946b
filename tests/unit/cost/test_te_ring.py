"""Transformer Engine's P2P ring context parallelism (cost/te_ring.py): no cost at cp 1, the step
shapes and merge bytes of AttnFuncWithCPAndKVP2P counted by hand per rank, the trait's loading."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from autoplan.cost import te_ring
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import load_runtime, runtime_from_dict
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.plan import plan_from_dict

MODEL = load_model("llama-3.1-8b")  # 32 query heads, 8 K/V heads of 128


def _plan(cp: int, tp: int = 1) -> object:
    return plan_from_dict({"model": "llama-3.1-8b", "cluster": {"profile": "h100-sxm-80gb",
                                                                "num_gpus": 8},
                           "parallel": {"dp": 8 // (cp * tp), "tp": tp, "cp": cp},
                           "zero_stage": 1, "batch": {"micro_batch_size": 1,
                                                      "global_batch_size": 64}})


def test_megatron_presets_run_tes_ring_and_cp_1_prices_as_without_it() -> None:
    for name in ("megatron", "megatron-deepep", "megatron-allgather", "nemo"):
        assert load_runtime(name).cp_exchange == "te-p2p"
    assert load_runtime("megatron-2022").cp_exchange == "all-gather"
    ring = load_runtime("megatron")
    gathered = replace(ring, cp_exchange="all-gather")
    one, one_ag = estimate_plan(_plan(1), runtime=ring), estimate_plan(_plan(1), runtime=gathered)
    assert one.time == one_ag.time and one.memory == one_ag.memory
    two, two_ag = estimate_plan(_plan(2), runtime=ring), estimate_plan(_plan(2), runtime=gathered)
    assert two.time != two_ag.time  # the ring is priced where cp > 1


@pytest.mark.parametrize(("cp", "c"), [(2, 2048.0), (4, 1024.0)])
def test_each_ring_step_sees_two_chunks_of_2cp(cp: int, c: float) -> None:
    # s = 8192 in 2cp chunks of c; rank i holds chunks i and 2cp-1-i
    lengths = te_ring.step_lengths(8192, np.array(cp))
    assert lengths["diagonal"] == (2 * c, 2 * c)
    assert lengths["first_keys"] == (2 * c, c)
    assert lengths["second_queries"] == (c, 2 * c)
    # every step does the same QK^T work: the causal diagonal half its square
    for kind, (queries, keys) in lengths.items():
        causal = 0.5 if kind == "diagonal" else 1.0
        assert causal * float(np.asarray(queries) * np.asarray(keys)) == 2 * c * c


def _hand_count(cp: int, q: float, k: float, lse: float) -> tuple[float, float]:
    """Forward and backward bytes, walked rank by rank and step by step through the loops of
    AttnFuncWithCPAndKVP2P (16-bit data, float64 LSE while merging), averaged over ranks."""
    fwd_total = bwd_total = 0.0
    for rank in range(cp):
        fwd = 8 * k + 2 * q + 12 * lse + 12 * lse  # K/V cat, out zeroed, LSE clone and cast
        for i in range(cp):
            full_q = i <= rank  # the diagonal step and steps i <= rank see every query
            if i > 0:
                fwd += 4 * k if full_q else 2 * q  # contiguous half of K/V, or of q
                fwd += 20 * lse if full_q else 10 * lse  # LSE correction in float64
            fwd += 6 * q if full_q else 3 * q  # out += out_step * exp(...), 16-bit
            fwd += 8 * lse if full_q else 4 * lse  # both LSEs read by it
        bwd = 8 * k + 4 * lse  # K/V into the send buffer, second LSE half
        for i in range(cp):
            diagonal = i == cp - 1
            full_q = diagonal or i >= cp - rank - 1
            if not diagonal:
                bwd += 4 * k if full_q else 6 * q  # contiguous K/V half, or q, out, dout halves
            bwd += 6 * q if full_q else 3 * q  # dQ += dQ_step
            bwd += 6 * k if (full_q and not diagonal) else 12 * k  # dK/dV into the buffer
        fwd_total, bwd_total = fwd_total + fwd, bwd_total + bwd
    return fwd_total / cp, bwd_total / cp


@pytest.mark.parametrize("cp", [2, 4])
def test_merge_bytes_match_a_count_of_each_ranks_steps(cp: int) -> None:
    tokens, tp = 8192 / cp, 2
    q, k = tokens * 32 * 128 / tp, tokens * 8 * 128 / tp
    lse = tokens * 32 / tp
    counted = te_ring.elementwise_bytes(MODEL, np.array(tokens), np.array(tp), np.array(cp))
    fwd, bwd = _hand_count(cp, q, k, lse)
    assert float(counted["forward"]) == pytest.approx(fwd, rel=1e-12)
    assert float(counted["backward"]) == pytest.approx(bwd, rel=1e-12)
    none = te_ring.elementwise_bytes(MODEL, np.array(8192.0), np.array(tp), np.array(1))
    assert float(none["forward"]) == float(none["backward"]) == 0.0


def test_sends_hide_behind_the_steps_kernels() -> None:
    profile = load_profile("h100-sxm-80gb")
    chunk, inside = np.array(64e6), np.array(True)
    one = float(te_ring.comm.p2p_time_s(chunk, inside, profile))
    two = float(te_ring.comm.p2p_time_s(2 * chunk, inside, profile))
    for cp in (2, 4):
        idle = {key: np.array(0.0) for key in ("diagonal_forward", "diagonal_backward",
                                               "step_forward", "step_backward")}
        bare = te_ring.exchange_time_s(chunk, np.array(cp), idle, inside, profile)
        # forward: cp-1 K/V sends; backward: K/V, cp-2 of K/V with dK/dV, then dK/dV
        assert float(bare["forward"]) == pytest.approx((cp - 1) * one)
        assert float(bare["backward"]) == pytest.approx(2 * one + (cp - 2) * two)
        busy = {key: np.array(1.0) for key in idle}  # a second per kernel hides every send
        hidden = te_ring.exchange_time_s(chunk, np.array(cp), busy, inside, profile)
        assert float(hidden["forward"]) == float(hidden["backward"]) == 0.0


def test_ring_buffers_are_held_beside_the_kept_tensors() -> None:
    parts = {"attn_out": np.array(100.0), "qkv": np.array(150.0)}  # Q 100, K+V 50
    fwd, bwd = te_ring.attention_bytes(parts, np.array(4), "bf16")
    assert float(fwd) == 4 * 50 + 4 * 100  # cp K/V buffers, cp per-step outputs
    assert float(bwd) == 5 * 50 + 2 * 100 + 1.5 * 100
    assert float(te_ring.attention_bytes(parts, np.array(1), "bf16")[0]) == 0.0


def test_the_trait_loads_and_refuses_like_the_others() -> None:
    assert runtime_from_dict({"name": "x", "cp_exchange": "te-p2p"}).cp_exchange == "te-p2p"
    with pytest.raises(ConfigError, match="cp_exchange") as err:
        runtime_from_dict({"name": "x", "cp_exchange": "te-ring"})
    assert "te-p2p" in str(err.value) and "\n" not in str(err.value)
