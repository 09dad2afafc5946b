"""Time the GEMMs and attention of real transformer blocks on this device against the cost model.

GEMMs: for each model (MPT 125M-70B as MosaicML's tables ran them, Llama 3 8B and 70B) and each
token count per micro-batch, times the four GEMMs of one block at tp 1 (QKV, output projection,
MLP up, MLP down) and the output layer with torch.matmul, each in its three passes: forward
(m x n output, inner k), input gradient (m x k, inner n) and weight gradient (k x n, inner m,
the tokens). It prints measured TFLOP/s, the share of the profile's peak it is, and the share
the cost model runs that GEMM at (compute.gemm_time_s: the profile's efficiency for its FLOPs
and, on a datasheet profile, the tile/wave quantization of its output; both backward GEMMs are
priced at the forward's rate, compute.layer_times_s and logits_times_s). The questions it
answers on a GPU: do GEMMs whose inner dimension is a small model's width (k = 768-2048) run
below what the curve gives their FLOPs, and do the two backward GEMMs (a small weight-gradient
output over a long inner dimension) run at the forward's rate? The MPT tables' 125M-1B runs
are 5-25% slower than the model prices them (benchmarks/data/mpt-llm-foundry.yaml) and the
curve was read from square GEMMs.

Attention: for MPT 125M's heads (12 x 64) and MPT 7B's (32 x 128), times causal
scaled_dot_product_attention (FlashAttention-2 on CUDA, torch's CPU flash kernel on a CPU)
forward and backward at a fixed token count per micro-batch over sequence lengths 512-16,384,
against attention_kernels.attention_efficiency's shares, by length on every GPU profile: the H100
family's from the FlashAttention-3 paper (Figs. 5-6), the A100's the FA2 paper's 2K-8K figure
spread by that kernel's H100 shape (no A100 per-length measurement was found), read at the
loaded node's clock (efficiency.attention_clock) as the GEMMs' curve is: one GPU timed alone
runs at its burst clock, so expect it above both by about 1 / 0.915. The MPT A100 error runs
from -22% at 512 tokens to 0% at 65,536 at the same GEMM shapes, so how a causal kernel's speed
depends on the length on this GPU is the question.

Run: python benchmarks/gemm_shapes.py [--device cpu|cuda] [--profile NAME] [--models M ...]
     [--tokens N ...] [--attention-models M ...] [--attention-tokens N] [--seq-lens S ...]
     [--repeats R] [--budget-s S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autoplan import fsutil
from autoplan.cost import attention_kernels, block_time, compute
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, load_profile
from autoplan.model_spec import ModelSpec, load_model
from autoplan.profiler.compute import DTYPES, time_call

MPT = {"mpt-125m": (768, 12, 12), "mpt-350m": (1024, 24, 16), "mpt-1b": (2048, 24, 16),
       "mpt-7b": (4096, 32, 32), "mpt-70b": (8192, 80, 64)}
"""(d_model, layers, heads) of MosaicGPT as the MPT tables ran it (FFN 4 d, vocab 50,368)."""
DEFAULT_MODELS = ("mpt-125m", "mpt-350m", "mpt-1b", "mpt-7b", "llama-3-8b", "llama-3-70b")
DEFAULT_TOKENS = (8192, 65536)
GEMM_NAMES = ("qkv", "proj", "mlp_up", "mlp_down")
PASSES = ("fwd", "dgrad", "wgrad")
DEFAULT_ATTENTION_MODELS = ("mpt-125m", "mpt-7b")
DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_ATTENTION_TOKENS = 16384
GEMM_BUDGET_SHARE = 0.7
"""Share of --budget-s the GEMMs may spend before the attention sweep starts."""


def model_of(name: str) -> ModelSpec:
    """An MPT size of the tables (MPT) or an autoplan model preset."""
    if name in MPT:
        h, layers, heads = MPT[name]
        return ModelSpec(name=name, num_layers=layers, hidden_size=h, num_heads=heads,
                         vocab_size=50368, seq_len=2048, tie_embeddings=True)
    return load_model(name)


def shapes(model: ModelSpec, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of the block's forward GEMMs at tp 1 (compute.gemm_shapes_per_layer's
    order) and of the output layer, for `tokens` tokens."""
    t, tp = np.array([float(tokens)]), np.array([1.0])
    out = []
    for name, flops, (m, n) in zip(GEMM_NAMES, compute.gemm_flops_per_layer(model, t, tp),
                                   compute.gemm_shapes_per_layer(model, t, tp), strict=True):
        m_, n_ = int(np.ravel(m)[0]), int(np.ravel(n)[0])
        out.append((name, m_, n_, round(float(np.ravel(flops)[0]) / (2.0 * m_ * n_))))
    out.append(("logits", tokens, model.vocab_size, model.hidden_size))
    return out


def pass_shape(pass_: str, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(m, n, k) of one pass of the forward GEMM Y[m, n] = X[m, k] W[k, n]: the input gradient
    dX = dY W^T is m x k over n, the weight gradient dW = X^T dY is k x n over m."""
    return {"fwd": (m, n, k), "dgrad": (m, k, n), "wgrad": (k, n, m)}[pass_]


def predicted_share(profile: ClusterProfile, m: int, n: int, k: int, precision: str) -> float:
    """The share of the precision's peak the cost model runs an m x n x k GEMM at (an FP8 one
    at the profile's FP8 figure, block_time.profile_gemm_peak)."""
    flops = 2.0 * m * n * k
    seconds = compute.gemm_time_s(np.array([flops]), profile,
                                  block_time.profile_gemm_peak(profile, precision),
                                  (np.array([float(m)]), np.array([float(n)])))
    return float(flops / (float(seconds[0]) * profile.device.peak(precision)))


def time_gemm(m: int, n: int, k: int, device: torch.device, dtype: torch.dtype,
              repeats: int) -> float:
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    return time_call(lambda: torch.matmul(a, b), device, repeats)


def attention_kernel(device: torch.device, precision: str) -> str:
    """The profile's name for the kernel SDPA runs here: FlashAttention-2 on CUDA (pinned in
    time_attention), torch's CPU flash kernel filed per dtype on a CPU."""
    return "fa2" if device.type == "cuda" else f"sdpa-cpu@{precision}"


def attention_work(batch: int, seq: int, heads: int, head_dim: int) -> float:
    """Forward FLOPs a causal fused kernel does: half of 4 b s^2 (a d), the cost model's
    attention_core_flops with its causal skip."""
    return 0.5 * 4.0 * batch * seq * seq * heads * head_dim


def predicted_attention_shares(profile: ClusterProfile, kernel: str, work: float, seq: int
                               ) -> tuple[float, float]:
    """(forward, backward) shares of the peak the cost model runs the causal kernel at, for
    sequences of `seq` tokens."""
    fwd, bwd = attention_kernels.attention_efficiency(profile, kernel, np.array([2.0 * work]),
                                            np.array([float(seq)]))
    return float(np.ravel(fwd)[0]), float(np.ravel(bwd)[0])


def time_attention(batch: int, seq: int, heads: int, head_dim: int, device: torch.device,
                   dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """Median (forward, backward) seconds of causal SDPA on (batch, heads, seq, head_dim)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def qkv() -> list[torch.Tensor]:
        return [torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype,
                            requires_grad=True) for _ in range(3)]

    backends = [SDPBackend.FLASH_ATTENTION]
    q, k, v = qkv()
    with sdpa_kernel(backends):
        with torch.no_grad():
            forward = time_call(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True), device, repeats)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.randn_like(out)
        backward = time_call(lambda: torch.autograd.grad(out, (q, k, v), grad,
                                                         retain_graph=True), device, repeats)
    return forward, backward


def measure_attention(args: argparse.Namespace, profile: ClusterProfile, deadline: float
                      ) -> list[dict[str, Any]]:
    device, dtype = torch.device(args.device), DTYPES[args.precision]
    peak, kernel = profile.device.peak(args.precision), attention_kernel(device, args.precision)
    rows = []
    for name in args.attention_models:
        model = model_of(name)
        heads, head_dim = model.num_heads, model.q_width // model.num_heads
        for seq in args.seq_lens:
            if time.monotonic() > deadline:
                print(f"gemm_shapes: budget of {args.budget_s:.0f} s spent; attention stopped "
                      f"before {name} at {seq} tokens", file=sys.stderr)
                return rows
            batch = max(1, args.attention_tokens // seq)
            fwd_s, bwd_s = time_attention(batch, seq, heads, head_dim, device, dtype,
                                          args.repeats)
            work = attention_work(batch, seq, heads, head_dim)
            pred_f, pred_b = predicted_attention_shares(profile, kernel, work, seq)
            for pass_, seconds, flops, pred in (
                    ("fwd", fwd_s, work, pred_f),
                    ("bwd", bwd_s, attention_kernels.FLASH_BACKWARD * work, pred_b)):
                rows.append({"model": name, "kernel": kernel, "batch": batch, "seq": seq,
                             "heads": heads, "head_dim": head_dim, "pass": pass_,
                             "flops": flops, "seconds": seconds,
                             "tflops": flops / seconds / 1e12,
                             "measured_share": flops / seconds / peak,
                             "predicted_share": pred})
    return rows


def measure(args: argparse.Namespace, profile: ClusterProfile
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(GEMM rows, attention rows), the GEMMs stopping at GEMM_BUDGET_SHARE of the budget."""
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread, as one runtime rank runs (and as profiled)
    dtype = DTYPES[args.precision]
    peak = profile.device.peak(args.precision)
    start, rows = time.monotonic(), []
    gemm_deadline = start + GEMM_BUDGET_SHARE * args.budget_s
    for name in args.models:
        model = model_of(name)
        for tokens in args.tokens:
            for gemm, m0, n0, k0 in shapes(model, tokens):
                # the cost model prices both backward GEMMs at the forward's rate
                priced = predicted_share(profile, m0, n0, k0, args.precision)
                for pass_ in PASSES:
                    if time.monotonic() > gemm_deadline:
                        print(f"gemm_shapes: GEMM share of the {args.budget_s:.0f} s budget "
                              f"spent; GEMMs stopped before {name} {gemm} at {tokens} tokens",
                              file=sys.stderr)
                        return rows, measure_attention(args, profile, start + args.budget_s)
                    m, n, k = pass_shape(pass_, m0, n0, k0)
                    seconds = time_gemm(m, n, k, device, dtype, args.repeats)
                    flops = 2.0 * m * n * k
                    rows.append({"model": name, "tokens": tokens, "gemm": gemm, "pass": pass_,
                                 "m": m, "n": n, "k": k, "flops": flops, "seconds": seconds,
                                 "tflops": flops / seconds / 1e12,
                                 "measured_share": flops / seconds / peak,
                                 "predicted_share": priced})
    return rows, measure_attention(args, profile, start + args.budget_s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"),
                    default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", help="profile to compare with (default: a100-sxm4-80gb on "
                    "CUDA unless the GPU's name says H100/H200, cpu-gloo on CPU)")
    ap.add_argument("--precision", default="bf16", choices=tuple(DTYPES))
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--tokens", nargs="+", type=int, default=list(DEFAULT_TOKENS))
    ap.add_argument("--attention-models", nargs="*", default=list(DEFAULT_ATTENTION_MODELS),
                    help="models whose heads the attention sweep times (none: no sweep)")
    ap.add_argument("--attention-tokens", type=int, default=DEFAULT_ATTENTION_TOKENS,
                    help="tokens per micro-batch of the attention sweep (batch = this / length)")
    ap.add_argument("--seq-lens", nargs="+", type=int, default=list(DEFAULT_SEQ_LENS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--json", type=Path, help="also write the rows here (never overwritten)")
    args = ap.parse_args(argv)
    for name in [*args.models, *args.attention_models]:
        if name not in MPT:
            load_model(name)  # ConfigError naming the model if unknown
    counts = [*args.tokens, *args.seq_lens, args.attention_tokens, args.repeats]
    if any(c < 1 for c in counts):
        raise ConfigError("--tokens/--seq-lens/--attention-tokens/--repeats",
                          f"got {args.tokens}, {args.seq_lens}, {args.attention_tokens}, "
                          f"{args.repeats}", "use positive counts")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", "got cuda", "no CUDA device here; use --device cpu")
    if args.device == "cuda" and args.attention_models and args.precision not in ("bf16", "fp16"):
        raise ConfigError("--precision", f"got {args.precision} with an attention sweep on cuda",
                          "FlashAttention-2 runs bf16 or fp16; use one, or --attention-models "
                          "with no names")
    return args


def default_profile(device: str) -> str:
    if device == "cpu":
        return "cpu-gloo"
    gpu = torch.cuda.get_device_name()
    return ("h200-sxm-141gb" if "H200" in gpu else "h100-sxm-80gb" if "H100" in gpu
            else "a100-sxm4-80gb")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        profile = load_profile(args.profile or default_profile(args.device))
        if args.json is not None:
            fsutil.check_file_target(args.json, force=False, field="--json")
    except ConfigError as err:
        print(f"gemm_shapes: {err}", file=sys.stderr)
        return 2
    rows, attention = measure(args, profile)
    print(f"{profile.name} ({args.device}, {args.precision}): measured against the cost model's "
          "share of the peak (backward GEMMs priced at the forward's share)")
    print(f"{'model':12} {'tokens':>7} {'gemm':9} {'pass':6} {'m':>7} {'n':>7} {'k':>6} "
          f"{'TFLOP/s':>9} {'measured':>9} {'model':>7} {'model/meas':>10}")
    for r in rows:
        print(f"{r['model']:12} {r['tokens']:>7} {r['gemm']:9} {r['pass']:6} {r['m']:>7} "
              f"{r['n']:>7} {r['k']:>6} {r['tflops']:>9.1f} {r['measured_share']:>9.1%} "
              f"{r['predicted_share']:>7.1%} {r['predicted_share'] / r['measured_share']:>10.2f}")
    if attention:
        print(f"causal attention ({attention[0]['kernel']}), {args.attention_tokens} tokens per "
              "micro-batch: measured against the cost model's share")
        print(f"{'model':12} {'seq':>6} {'batch':>5} {'heads':>5} {'d':>4} {'pass':4} "
              f"{'TFLOP/s':>9} {'measured':>9} {'model':>7} {'model/meas':>10}")
        for r in attention:
            print(f"{r['model']:12} {r['seq']:>6} {r['batch']:>5} {r['heads']:>5} "
                  f"{r['head_dim']:>4} {r['pass']:4} {r['tflops']:>9.1f} "
                  f"{r['measured_share']:>9.1%} {r['predicted_share']:>7.1%} "
                  f"{r['predicted_share'] / r['measured_share']:>10.2f}")
    if args.json is not None:
        try:
            fsutil.write_text(args.json, json.dumps(
                {"profile": profile.name, "device": args.device, "precision": args.precision,
                 "rows": rows, "attention": attention}, indent=2) + "\n", field="--json")
        except ConfigError as err:
            print(f"gemm_shapes: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
