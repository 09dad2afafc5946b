"""Transformer Engine's P2P ring context parallelism (cp_exchange "te-p2p"), as Megatron-Core runs
it by default: its ring steps' kernels, K/V sends, output merges and working memory per block and
micro-batch. The all-gather and torch-ring exchanges stay in comm.py, compute.py and memory.py.

Read off TransformerEngine's AttnFuncWithCPAndKVP2P (transformer_engine/pytorch/attention.py in
TE 1.x-2.1; attention/dot_product_attention/context_parallel.py from TE 2.2), the class Megatron-
Core's TEDotProductAttention calls with cp_comm_type "p2p": its default where unset (TE >= 1.10;
before it the only kind), as --cp-comm-type defaults to ["p2p"] (megatron/training/arguments.py).
- Chunking: the sequence in 2cp chunks of c = s/(2cp) tokens, rank i holding chunks i and
  2cp-1-i (get_seq_chunk_ids_for_reordering), so a causal ring step never idles a rank.
- Step 0 (forward; the last backward step): the rank's own K/V, a causal kernel over its 2c
  queries and 2c keys. Steps 1..cp-1 on rank r, K/V from rank r-i: i <= r, all 2c queries
  against the first c keys (chunk r-i), no mask; i > r, the second c queries against all 2c
  keys, no mask. Every step does 2c^2 of QK^T work: half the rank's square, cp steps in all.
- Sends: the K/V chunk (K and V concatenated, 16-bit: kv dtype) to rank r+1 at steps 0..cp-2,
  launched before the step's kernel (flash_attn_p2p_communicate, batch_isend_irecv at cp 2) and
  waited at the next step, so each hides behind one kernel. Backward sends K/V at step 0, K/V
  and the partial dK/dV together (one 16-bit buffer of both) at steps 1..cp-2, dK/dV at step
  cp-1; each waited after the step's kernel, before the step's dK/dV add.
- Merges: the log-sum-exp in float64 (clone, a correction per step after the first, then cast
  to fp32); the output 16-bit (zeros_like(q)), one correction pass per step after the loop
  (flash_attn_fwd_out_correction: out += out_step * exp(lse_step - lse)), over the second query
  half for the half steps. Backward adds each step's dQ and dK/dV into 16-bit buffers.
- Saved: q, the last received K/V buffer (in place of the local K/V), out and the fp32 LSE:
  what a plain fused attention keeps, so the kept activations are unchanged.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost import attention_kernels, comm, compute
from autoplan.cost.rows import Rows
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec


def step_lengths(seq_len: float, cp: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(query tokens, key tokens) of each kind of ring step, per sequence: "diagonal" (step 0,
    causal over the rank's two chunks), "first_keys" (steps i <= rank: all queries, the first
    key chunk) and "second_queries" (steps i > rank: the second query chunk, all keys)."""
    c = seq_len / (2.0 * np.asarray(cp, float))
    return {"diagonal": (2.0 * c, 2.0 * c), "first_keys": (2.0 * c, c),
            "second_queries": (c, 2.0 * c)}


def step_times_s(model: ModelSpec, profile: ClusterProfile, peak: float, kernel: str,
                 b: np.ndarray, tp: np.ndarray, cp: np.ndarray) -> dict[str, np.ndarray]:
    """Seconds of one ring step's kernel: {diagonal,step}_{forward,backward}. Each step does
    1/(2cp) of the rank's full-square attention FLOPs (compute.attention_core_flops), at the
    kernel's efficiency read at the keys it attends over (the length the profile's curves file,
    attention_kernels.attention_efficiency). A non-diagonal step costs its slower kind: rank
    cp-1 runs every step as first_keys and rank 0 as second_queries, and the ring waits for
    both."""
    flops = compute.attention_core_flops(model, b, tp, cp)
    work = flops / (2.0 * np.asarray(cp, float))
    lengths = step_lengths(model.seq_len, cp)

    def at(kind: str) -> tuple[np.ndarray, np.ndarray]:
        fwd, bwd = attention_kernels.attention_efficiency(profile, kernel, flops, lengths[kind][1],
                                                model.head_width)
        return work / (peak * fwd), attention_kernels.FLASH_BACKWARD * work / (peak * bwd)

    diagonal, first, second = at("diagonal"), at("first_keys"), at("second_queries")
    return {"diagonal_forward": diagonal[0], "diagonal_backward": diagonal[1],
            "step_forward": np.maximum(first[0], second[0]),
            "step_backward": np.maximum(first[1], second[1])}


def core_times_s(steps: dict[str, np.ndarray], cp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of a block's ring attention kernels: the diagonal step and
    cp - 1 others."""
    others = np.asarray(cp, float) - 1.0
    return (steps["diagonal_forward"] + others * steps["step_forward"],
            steps["diagonal_backward"] + others * steps["step_backward"])


def exchange_time_s(kv_chunk_bytes: np.ndarray, cp: np.ndarray, steps: dict[str, np.ndarray],
                    inside_node: np.ndarray, profile: ClusterProfile) -> dict[str, np.ndarray]:
    """Exposed seconds of the ring's sends per block and micro-batch, {"forward", "backward"}:
    each send beyond the kernel it runs beside. `kv_chunk_bytes`: the rank's K and V (16-bit).
    Forward: cp - 1 sends of it, the first behind the diagonal kernel. Backward: K/V behind the
    first (non-diagonal) step, K/V with dK/dV (2x) behind each of the next cp - 2, dK/dV behind
    the last, diagonal, step."""
    cp = np.asarray(cp, float)
    send = comm.p2p_time_s(kv_chunk_bytes, inside_node, profile)
    double = comm.p2p_time_s(2.0 * np.asarray(kv_chunk_bytes, float), inside_node, profile)
    middle = np.maximum(cp - 2.0, 0.0)
    forward = (np.maximum(send - steps["diagonal_forward"], 0.0)
               + middle * np.maximum(send - steps["step_forward"], 0.0))
    backward = (np.maximum(send - steps["step_backward"], 0.0)
                + middle * np.maximum(double - steps["step_backward"], 0.0)
                + np.maximum(send - steps["diagonal_backward"], 0.0))
    ring = cp > 1
    return {"forward": np.where(ring, forward, 0.0), "backward": np.where(ring, backward, 0.0)}


def elementwise_bytes(model: ModelSpec, tokens: np.ndarray, tp: np.ndarray,
                      cp: np.ndarray) -> dict[str, np.ndarray]:
    """Bytes the element-wise kernels around the ring move per block and micro-batch on one
    rank, {"forward", "backward"}, averaged over the ranks (rank r runs r first_keys steps and
    cp-1-r second_queries steps each way); 0 where cp is 1. q, k: the rank's query and K
    elements (`tokens` x width / tp), l = its LSE values (tokens x heads / tp); 16-bit data,
    2 bytes an element, a read and a write each for a copy, 6 bytes for a 16-bit add.
    - forward: K/V concatenated for the first send, 8k; the cuDNN path's contiguous copy of the
      first key half at a first_keys step (4k) or of the second query half at a second_queries
      step (2q); out zeroed, 2q; one output correction per step (read out and the step's output,
      write out: 6q over the queries the step saw, 3q for a half step); the LSE's float64
      clone (12l), a correction per step after the first (read 8 + 4, write 8: 20l, 10l for a
      half step), the cast back (12l), and the output corrections' reads of both LSEs (8l, 4l).
    - backward: K/V copied into the first send buffer, 8k; the contiguous copies (4k, or q, out
      and dout's second halves, 6q); dQ added per step (6q, 3q for a half step) and dK/dV added
      into the received buffer (12k, 6k where the step saw the first key half); the second
      half of the LSE made contiguous (4l). A first write is a copy, counted as an add."""
    cp = np.asarray(cp, float)
    per_token = np.asarray(tokens, float) / np.asarray(tp, float)
    q = model.q_width * per_token
    k = model.kv_heads * model.head_width * per_token
    lse = model.num_heads * per_token
    others = cp - 1.0  # half first_keys, half second_queries on the mean rank
    forward = (8.0 * k + 2.0 * q + 6.0 * q + (12.0 + 12.0 + 8.0) * lse
               + others * (0.5 * (4.0 * k + 2.0 * q) + 0.5 * (6.0 + 3.0) * q
                           + 0.5 * (20.0 + 10.0) * lse + 0.5 * (8.0 + 4.0) * lse))
    backward = (8.0 * k + 6.0 * q + 12.0 * k + 4.0 * lse
                + others * (0.5 * (4.0 * k + 6.0 * q) + 0.5 * (6.0 + 3.0) * q
                            + 0.5 * (6.0 + 12.0) * k))
    ring = cp > 1
    return {"forward": np.where(ring, forward, 0.0), "backward": np.where(ring, backward, 0.0)}


def attention_bytes(parts: dict[str, np.ndarray], cp: np.ndarray,
                    precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) bytes one block's ring attention holds beyond its kept tensors, on
    the rank that holds most (rank cp-1, whose steps all see every query). Forward: the cp K/V
    buffers the loop keeps until it returns (p2p_comm_buffers: the first a concatenated copy of
    the local K/V, the last the one saved) and the cp per-step outputs (out_per_step); the
    per-step LSEs (1/head_dim of an output in fp32) left out. Backward: two send buffers of
    K/V and dK/dV (4 local K/V), dQ, one step's dQ and dK/dV, and the step's contiguous copy
    of half its K/V or of q, out and dout's second halves. 0 without context parallelism."""
    scale = 2.0 if precision == "fp32" else 1.0
    q = parts["attn_out"]  # the local queries are as wide as the attention output
    kv = parts["qkv"] - q
    cp = np.asarray(cp, float)
    forward = (cp * kv + cp * q) * scale
    backward = (5.0 * kv + 2.0 * q + np.maximum(0.5 * kv, 1.5 * q)) * scale
    return np.where(cp > 1, forward, 0.0), np.where(cp > 1, backward, 0.0)


def _steps(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
           runtime: RuntimeTraits) -> dict[str, np.ndarray]:
    """step_times_s at the peak and kernel the runtime's fused attention runs at."""
    core = runtime.attention_precision(precision)
    return step_times_s(model, profile, profile.device.peak(core),
                        f"{runtime.attention_kernel}@{core}", r.b, r.tp, r.cp)


def block_extra_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                  runtime: RuntimeTraits, lt: dict[str, np.ndarray], eager: bool
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) device seconds the ring adds to a block's compute.layer_times_s: its
    steps' kernels in place of the one fused core there (lt core_forward/core_backward), and
    the merges' element-wise bytes. An eager core (no ring in TE) keeps its own time."""
    ring = np.asarray(r.cp) > 1
    merges = elementwise_bytes(model, model.seq_len / r.cp * r.b, r.tp, r.cp)
    fwd, bwd = (compute.memory_time_s(merges[k], profile) for k in ("forward", "backward"))
    if not eager:
        core_fwd, core_bwd = core_times_s(_steps(model, profile, r, precision, runtime), r.cp)
        fwd = fwd + np.where(ring, core_fwd - lt["core_forward"], 0.0)
        bwd = bwd + np.where(ring, core_bwd - lt["core_backward"], 0.0)
    return fwd, bwd


def ring_time_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                runtime: RuntimeTraits, inside_node: np.ndarray) -> dict[str, np.ndarray]:
    """exchange_time_s of a block: the rank's K and V chunk (the grouped heads, split by tp;
    TE receives K/V as Megatron projects them, before any GQA repeat) at the run's 16-bit
    width (4 bytes in an fp32 run)."""
    kv_chunk = (2.0 * r.weight_bytes * model.seq_len / r.cp * r.b
                * model.kv_heads * model.head_width / r.tp)
    return exchange_time_s(kv_chunk, r.cp, _steps(model, profile, r, precision, runtime),
                           inside_node, profile)
