"""FLOP counts and compute-time terms."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import attention_kernels, compute
from autoplan.cost.params import total_params
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS


@pytest.mark.parametrize("name", ["gpt3-1.3b", "gpt3-13b", "gpt3-175b"])
def test_model_flops_match_megatron_formula(name: str) -> None:
    # Narayanan et al. 2021 (SC21), eq. 3 without recompute: 72 B s L h^2 (1 + s/6h + V/12Lh).
    m = PRESETS[name]
    s, L, h, V = m.seq_len, m.num_layers, m.hidden_size, m.vocab_size
    expected = 72 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert compute.model_flops_per_sequence(m) == pytest.approx(expected, rel=1e-9)


def test_model_flops_close_to_6N_per_token_for_short_sequences() -> None:
    m = PRESETS["llama-3-8b"].replace(seq_len=128)
    per_token = compute.model_flops_per_sequence(m) / m.seq_len
    # 6 FLOPs per parameter per token (Kaplan et al. 2020), less the input embedding: a lookup
    non_embedding = total_params(m) - m.vocab_size * m.hidden_size
    assert per_token == pytest.approx(6 * non_embedding, rel=0.02)


def test_gemm_time_uses_size_dependent_efficiency() -> None:
    prof = load_profile("a100-sxm4-80gb")
    peak = prof.device.peak("bf16")
    small, large = np.array(1e8), np.array(1e12)
    t_small = compute.gemm_time_s(small, prof, peak)
    t_large = compute.gemm_time_s(large, prof, peak)
    assert float(t_small) / 1e8 > 5 * float(t_large) / 1e12  # small GEMMs are less efficient


def test_tensor_parallel_splits_gemm_flops() -> None:
    m = PRESETS["gpt3-13b"]
    one = sum(compute.gemm_flops_per_layer(m, np.array(2048.0), np.array(1.0)))
    eight = sum(compute.gemm_flops_per_layer(m, np.array(2048.0), np.array(8.0)))
    assert float(one) == pytest.approx(8 * float(eight))
    assert float(one) == pytest.approx(24 * 2048 * m.hidden_size**2)  # 24 s h^2 forward


@pytest.mark.parametrize("name", ["tiny", "tiny-llama", "tiny-llama+qkv_bias",
                                  "tiny-llama+qk_norm"])
def test_block_op_counts_match_the_runtime_block(name: str) -> None:
    """The cost model charges dispatch per aten op of a block; recount the runtime's block
    (q, k and v biases alone, Qwen2's layout, were priced as a bias-free block: 7 backward ops
    short, review of a7c4ba9; Qwen3's per-head q and k norms add 14 forward and 36 backward)."""
    import torch

    from autoplan.profiler.dispatch import _count, _materialize
    from autoplan.runtime.models.transformer import build_meta_model

    preset, _, feature = name.partition("+")
    spec = PRESETS[preset].replace(**{feature: True}) if feature else PRESETS[preset]
    model = build_meta_model(spec, 0.0)
    _materialize(model, spec)
    x = torch.randn(1, 8, spec.hidden_size, requires_grad=True)
    fwd, bwd, gemms = _count(model.layers["0"], x)
    f, b, g = compute.block_ops(spec)
    assert (f, g) == (fwd, gemms)
    assert abs(b - bwd) <= 2  # the per-feature deltas add up to within two backward ops


def test_host_overheads_charge_tensor_parallel_and_recompute() -> None:
    import dataclasses

    prof = load_profile("cpu-gloo")
    eff = dataclasses.replace(prof.efficiency, dtensor_op_overhead_s=1e-5,
                              checkpoint_op_overhead_s=2e-5, selective_op_overhead_s=3e-5)
    prof = dataclasses.replace(prof, efficiency=eff)
    model = PRESETS["tiny"]
    one = np.array([1.0])

    def times(tp: float) -> dict[str, np.ndarray]:
        return compute.layer_times_s(model, prof, 1e11, one, np.array([tp]), one, one * 0,
                                     one * 0, eager=False)

    t1, t2 = times(1.0), times(2.0)
    f, b, g = compute.block_ops(model)
    assert t1["dtensor"][0] == 0.0
    assert t2["dtensor"][0] == pytest.approx((f + b) * 1e-5)
    assert t1["full"][0] == pytest.approx(t1["forward"][0] + f * 2e-5)
    assert t1["all-but-gemms"][0] == pytest.approx(
        t1["core_forward"][0] + (f - g) * eff.op_overhead_s + f * 3e-5)


@pytest.mark.parametrize(("dtype", "precision"), [("bfloat16", "bf16"), ("float32", "fp32")])
def test_torch_cross_entropy_moves_the_bytes_the_traits_say(dtype, precision):
    """autoplan's runtime and torchtitan take F.cross_entropy of upcast logits: its aten ops,
    forward and backward, read and write 44 bytes per 16-bit logit (32 on fp32 logits, which
    are not cast), counted with the profiler's dispatch counter."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from autoplan.cost.runtimes import load_runtime
    from autoplan.profiler.traffic import _CountBytes

    t, v = 64, 1000
    x = torch.randn(t, v, dtype=getattr(torch, dtype), requires_grad=True)
    y = torch.randint(0, v, (t,))
    with _CountBytes() as counted:
        F.cross_entropy(x.float(), y).backward()
    per_logit = counted.bytes / (t * v)
    for runtime in ("autoplan-cuda", "torchtitan"):
        assert per_logit == pytest.approx(load_runtime(runtime).loss_bytes(precision), abs=0.05)


def test_the_loss_is_priced_by_the_bytes_its_kernels_move():
    """Llama 3.1 8B, 8,192 tokens, tp 1 on an H100: Megatron's vocab-parallel cross-entropy
    moves 52 bytes per logit, torch's 44; the output GEMMs are the same."""
    from autoplan.cost.runtimes import load_runtime

    m, prof = PRESETS["llama-3.1-8b"], load_profile("h100-sxm-80gb")
    one, vocab = np.array(1.0), np.array(float(m.vocab_size))
    peak = prof.device.peak("bf16")

    def loss_s(runtime: str) -> float:
        return float(compute.logits_times_s(m, prof, peak, one, one, one, vocab,
                                            load_runtime(runtime).loss_bytes("bf16")))

    logits = m.seq_len * m.vocab_size
    diff = loss_s("megatron") - loss_s("torchtitan")
    assert diff == pytest.approx(float(compute.memory_time_s(np.array(8.0 * logits), prof)))
    assert diff > 0


def test_a_block_prices_its_attention_at_the_model_s_head_width() -> None:
    """Two models with the same attention FLOPs (32 heads of 64, 16 of 128): the narrow heads'
    fused core takes longer by the ratio of the two widths' figures."""
    h100 = load_profile("h100-sxm-80gb")
    one, peak = np.array([1.0]), h100.device.peak("bf16")
    wide = PRESETS["llama-3-8b"].replace(seq_len=4096, num_heads=16, num_kv_heads=8,
                                         head_dim=128, hidden_size=2048)
    narrow = wide.replace(num_heads=32, num_kv_heads=16, head_dim=64)
    assert compute.attention_core_flops(wide, one, one, one) == pytest.approx(
        compute.attention_core_flops(narrow, one, one, one))

    def core(model) -> tuple[float, float]:
        f, b = compute.attention_core_times_s(model, h100, peak, one, one, one, one * 0.0,
                                              eager=False, causal_skip=True)
        return float(f[0]), float(b[0])

    (fw, bw), (fn, bn) = core(wide), core(narrow)
    flops, at_4k = np.full(1, 1e12), np.array([4096.0])
    f128, b128 = attention_kernels.attention_efficiency(h100, "fa2", flops, at_4k, 128)
    f64, b64 = attention_kernels.attention_efficiency(h100, "fa2", flops, at_4k, 64)
    assert fn / fw == pytest.approx(float(f128[0] / f64[0]))  # 319 / 284 TFLOP/s in the paper
    assert bn / bw == pytest.approx(float(b128[0] / b64[0]))  # 310 / 279
    assert fn / fw > 1.1


def test_a_block_s_attention_seconds_follow_the_length_each_rank_attends_over() -> None:
    """In a block, the figure is read at the tokens per sequence on one rank: seq_len / cp."""
    h100 = load_profile("h100-sxm-80gb")
    one = np.array([1.0])
    peak = h100.device.peak("bf16")

    def seconds_per_flop(seq: int, cp: float) -> float:
        model = PRESETS["llama-3-8b"].replace(seq_len=seq)
        parts = compute.layer_times_s(model, h100, peak, one, one, np.array([cp]), one * 0.0,
                                      one * 0.0, eager=False, causal_skip=True)
        work = 0.5 * compute.attention_core_flops(model, one, one, np.array([cp]))
        return float(parts["core_forward"][0] / work[0])

    eff = h100.efficiency.attention_forward["fa2"]
    assert seconds_per_flop(1024, 1.0) / seconds_per_flop(8192, 1.0) == pytest.approx(
        float(eff(8192) / eff(1024)))
    # 32K tokens over cp 8: each rank's kernels attend over 4K-token chunks
    assert seconds_per_flop(32768, 8.0) == pytest.approx(seconds_per_flop(4096, 1.0))


def test_the_attention_core_priced_fused_and_eager() -> None:
    """attention_core_times_s: a fused causal kernel skips the masked half (Dao 2023 §3.1) and
    its backward is FLASH_BACKWARD times the forward's work at the backward's own efficiency;
    eager runs the two batched GEMMs forward and four backward, plus the softmax's passes over
    the kept scores (SOFTMAX_PASSES, a third forward and two thirds backward)."""
    h100 = load_profile("h100-sxm-80gb")
    model, one = PRESETS["llama-3-8b"], np.array([1.0])
    peak = h100.device.peak("bf16")
    flops = compute.attention_core_flops(model, one, one, one)

    def fused(skip: bool) -> tuple[float, float]:
        f, b = compute.attention_core_times_s(model, h100, peak, one, one, one, one * 0.0,
                                              eager=False, causal_skip=skip)
        return float(f[0]), float(b[0])

    (f_all, b_all), (f_half, b_half) = fused(False), fused(True)
    assert f_half == pytest.approx(f_all / 2) and b_half == pytest.approx(b_all / 2)
    fwd_eff, bwd_eff = attention_kernels.attention_efficiency(h100, "fa2", flops,
                                                              np.array([8192.0]))
    assert b_all / f_all == pytest.approx(
        attention_kernels.FLASH_BACKWARD * float(fwd_eff[0]) / float(bwd_eff[0]))

    scores = np.array([3.0e9])  # bytes of kept scores
    f0, b0 = compute.attention_core_times_s(model, h100, peak, one, one, one, 0.0 * scores,
                                            eager=True)
    f1, b1 = compute.attention_core_times_s(model, h100, peak, one, one, one, scores,
                                            eager=True)
    assert float(b0[0]) == pytest.approx(2.0 * float(f0[0]))  # GEMMs alone: backward is twice
    softmax = compute.memory_time_s(scores * compute.SOFTMAX_PASSES, h100)
    assert float((f1 - f0)[0]) == pytest.approx(float(softmax[0]) / 3.0)
    assert float((b1 - b0)[0]) == pytest.approx(float(softmax[0]) * 2.0 / 3.0)


def test_block_host_seconds_count_each_op_and_fold_dtensor_where_the_host_runs_ahead() -> None:
    from dataclasses import replace

    cpu = load_profile("cpu-gloo")
    prof = replace(cpu, efficiency=replace(
        cpu.efficiency, op_overhead_s=1e-5, dtensor_op_overhead_s=3e-5,
        checkpoint_op_overhead_s=2e-5, selective_op_overhead_s=4e-6))
    model = PRESETS["tiny"]

    def first(x: object) -> float:
        return float(np.ravel(np.asarray(x))[0])

    ops_f, ops_b, ops_gemm = compute.block_ops(model)
    tp1, tp2 = np.array([1]), np.array([2])

    host, dtensor = compute.block_host_s(model, prof, tp1, False, 0.0, False)
    assert first(dtensor) == 0.0  # no DTensor without tensor parallelism
    assert first(host["forward"]) == pytest.approx(ops_f * 1e-5)
    assert first(host["backward"]) == pytest.approx(ops_b * 1e-5)
    # a full recompute re-issues the forward's ops, each through the checkpoint
    assert first(host["full"]) == pytest.approx(ops_f * (1e-5 + 2e-5))
    # partial policies re-issue the non-GEMM ops and inspect every forward op
    assert first(host["all-but-gemms"]) == pytest.approx(
        (ops_f - ops_gemm) * 1e-5 + ops_f * 4e-6)

    # an FSDP unit's hooks split between the passes like the ops
    hooked, _ = compute.block_host_s(model, prof, tp1, False, 1.0, False)
    assert first(hooked["forward"]) - first(host["forward"]) == pytest.approx(ops_f / (ops_f + ops_b))

    apart, dt = compute.block_host_s(model, prof, tp2, False, 0.0, False)
    assert first(dt) == pytest.approx((ops_f + ops_b) * 3e-5)
    assert first(apart["forward"]) == pytest.approx(ops_f * 1e-5)  # returned beside it
    ahead, folded = compute.block_host_s(model, prof, tp2, False, 0.0, True)
    assert first(folded) == 0.0
    assert first(ahead["forward"]) + first(ahead["backward"]) == pytest.approx(
        (ops_f + ops_b) * (1e-5 + 3e-5))


@pytest.mark.parametrize("name", ["a100-sxm4-80gb", "h100-sxm-80gb"])
def test_a_gemm_never_gets_slower_when_its_work_is_split(name: str) -> None:
    """Halving a GEMM's rows (cp, fewer tokens) or columns (tp) never adds padded tiles or
    waves (NVIDIA's tile/wave quantization), so its time never rises; and a shape that fills
    its tiles and waves exactly runs at the curve's best-shape rate."""
    prof = load_profile(name)
    peak = prof.device.peak("bf16")
    m = np.array([256.0, 512, 1000, 2048, 4096, 8192, 16384, 65536])[:, None, None]
    n = np.array([128.0, 384, 768, 1024, 1536, 2304, 4096, 6144, 14336])[None, :, None]
    k = np.array([768.0, 4096, 12288])[None, None, :]
    m, n, k = np.broadcast_arrays(m, n, k)

    def t(mm, nn):
        return compute.gemm_time_s(2.0 * mm * nn * k, prof, peak, (mm, nn))

    whole = t(m, n)
    assert (t(m / 2, n) <= whole * (1 + 1e-12)).all()
    assert (t(m, n / 2) <= whole * (1 + 1e-12)).all()
    tm, tn = prof.device.gemm_tile
    full = np.array(tm * prof.device.sm_count * 4.0), np.array(float(tn))
    flops = 2.0 * full[0] * full[1] * 4096
    assert float(compute.gemm_time_s(flops, prof, peak, full)) == pytest.approx(
        float(flops / (peak * prof.efficiency.matmul(flops))))
