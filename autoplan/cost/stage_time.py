"""Seconds per micro-batch of the pipeline's stages: a stage of blocks (block_time.py prices one)
with its ends (embedding, head and loss, multi-token prediction), and the slowest stage a step
waits on.

step_time.py turns the critical stage into seconds per step; compute.py, comm.py and mtp.py hold
the formulas and their sources.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost import block_time, comm, compute, mtp
from autoplan.cost.rows import Rows, recomputed_layers
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec


def embedding_grad_s(model: ModelSpec, profile: ClusterProfile, runtime: RuntimeTraits,
                     r: Rows) -> np.ndarray:
    """Seconds per micro-batch the embedding's dense gradient costs its stage beyond the lookup's
    backward: torch's embedding backward (F.embedding, which Megatron's VocabParallelEmbedding
    and torchtitan's both call) zero-fills a dense gradient of the rank's vocab/tp x h table
    (embedding_dense_backward: `at::zeros({num_weights, ...})`) before it adds the looked-up
    rows, and a runtime that adds gradients into its own buffer (RuntimeTraits.
    adds_into_grad_buffer) reads it again and reads and writes the buffer."""
    elements = r.vocab / r.tp * model.hidden_size
    add = (r.weight_bytes + 2.0 * r.grad_bytes) if runtime.adds_into_grad_buffer else 0.0
    return compute.memory_time_s(elements * (r.weight_bytes + add), profile)


def stage_s(c: block_time.BlockCosts, r: Rows, profile: ClusterProfile, runtime: RuntimeTraits,
            layers: np.ndarray, extra: np.ndarray, tp_ends: np.ndarray,
            extra_a2a: np.ndarray | float = 0.0, embed: np.ndarray | float = 0.0
            ) -> dict[str, np.ndarray]:
    """Seconds per micro-batch of a stage of `layers` blocks, by part (compute, recompute, tp,
    cp, ep), with its forward, backward and weight-gradient compute for the schedules; `extra`
    is the compute its ends add (head, loss, MTP), `tp_ends` their collectives, `extra_a2a`
    their all-to-alls, `embed` the embedding gradient."""
    lt, tp, tp_layer = c.block_s, c.tp, c.tp.collectives["layer"]
    n = recomputed_layers(layers, r)
    layer_hidden = layers * np.minimum((1.0 - tp.exposed) * tp_layer, tp.hideable)
    tp_hidden = layer_hidden + n * np.minimum((1.0 - tp.recompute_exposed) * tp.recompute,
                                              lt["gemm_forward"])
    contended = np.where(tp.by_nccl, tp_hidden,
                         np.minimum(tp.userbuffers_bulk * layers * tp_layer, layer_hidden))
    # all-to-alls hidden behind another micro-batch's compute as far as the runtime overlaps
    # them (RuntimeTraits.ep_comm_overlap), never more than that compute
    ep_hidden = runtime.ep_comm_overlap * np.minimum(
        layers * c.a2a + n * c.a2a_recompute + extra_a2a,
        layers * (lt["forward"] + lt["backward"]))
    # SMs a runtime reserves for communication are priced for the whole step (priced_profile)
    reserved = runtime.comm_reserved_sms > 0
    tp_raw = layers * tp_layer + n * tp.recompute + tp_ends
    ep_raw = layers * c.a2a + n * c.a2a_recompute + extra_a2a
    tp_exposed = tp_raw - tp_hidden + comm.contention_s(contended, profile)
    ep_exposed = ep_raw - ep_hidden + (0.0 if reserved else comm.contention_s(ep_hidden, profile))
    return {
        "compute": layers * (lt["forward"] + lt["backward"] + lt["dtensor"]) + extra + embed,
        "recompute": n * c.recompute,
        "tp": tp_exposed,
        "cp": layers * c.cp + n * c.cp_recompute,
        "ep": ep_exposed,
        # the exposed TP and expert all-to-all seconds inside the forward pass: each block and
        # end runs as many of its collectives forward as backward (Megatron's f/g pairs, a
        # dispatch and a combine each way), the recompute's all in backward
        "tp_forward": tp_exposed * (tp_raw - n * tp.recompute) / np.maximum(tp_raw, 1e-30) / 2.0,
        "ep_forward": ep_exposed * (ep_raw - n * c.a2a_recompute) / np.maximum(ep_raw, 1e-30)
                      / 2.0,
        "forward": layers * lt["forward"],
        "backward": layers * lt["backward"],
        # the head's and MTP's GEMMs: a third of their forward + backward is weight gradient
        "wgrad": layers * c.wgrad + extra / 3.0,
        "layers": layers + 0.0 * extra,
    }


def loss_on_first(r: Rows) -> np.ndarray:
    """1.0 where the head and its loss sit on the first stage (no pipeline, or ZB-V/DualPipe's
    V shape), else 0.0: they sit on the last."""
    return np.where((r.pp == 1) | r.v_shape, 1.0, 0.0)


def stages_s(c: block_time.BlockCosts, model: ModelSpec, profile: ClusterProfile, r: Rows,
             precision: str, runtime: RuntimeTraits) -> list[dict[str, np.ndarray]]:
    """stage_s of the first, the largest and the last pipeline stage, the ends with the
    embedding, the head and its loss, and multi-token prediction where they sit."""
    # the output layer stays 16-bit in fp8 runs; a trainer's metric passes read the main
    # head's logits only (RuntimeTraits.train_metric_passes)
    def head_t(metrics: bool) -> np.ndarray:
        return compute.logits_times_s(model, profile,
                                      block_time.sixteen_bit_peak(profile, precision), r.b,
                                      r.tp, r.cp, r.vocab, runtime.loss_bytes(precision, metrics))

    logit_t = head_t(True)
    embed_t = embedding_grad_s(model, profile, runtime, r)
    # multi-token prediction (cost/mtp.py) on the stage with the loss: one more block each
    # depth, priced as the stage's blocks, plus eh_proj, the MoE kind's excess and a second
    # head with its cross-entropy (fwd + bwd: 3x the forward extras)
    d_mtp = float(model.mtp_layers)
    mtp_x = 3.0 * mtp.extra_forward_s(model, profile,
                                      block_time.gemm_peak(profile, precision, runtime), r) \
        + d_mtp * head_t(False)
    mtp_a2a = mtp.extra_all_to_all_s(model, c.a2a)
    head_first = loss_on_first(r)
    head_last = 1.0 - head_first

    head_tp = (1.0 + d_mtp) * c.tp.collectives["head"]

    def stage(layers: np.ndarray, head: np.ndarray, tp_ends: np.ndarray,
              embed: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
        """An end stage: its blocks, and the head, loss and MTP where `head` is 1."""
        return stage_s(c, r, profile, runtime, layers + d_mtp * head, head * (logit_t + mtp_x),
                       tp_ends + head * head_tp, head * mtp_a2a, embed)

    return [stage(r.layers_first, head_first, c.tp.collectives["embedding"], embed_t),
            stage_s(c, r, profile, runtime, r.layers_max, 0.0 * r.layers_max,
                    0.0 * r.layers_max),
            stage(r.layers_last, head_last, 0.0 * r.layers_max)]


def critical_stage_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                     eager: bool, runtime: RuntimeTraits, parts: dict[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
    """Per-micro-batch seconds of the slowest of the first, largest and last stage, by part,
    with t_mb (its total), t_fill (what each other rank adds to the pipeline's fill),
    holds_head and norm_grad (sequence parallelism's partial norm gradients per tensor)."""
    c = block_time.block_costs(model, profile, r, precision, eager, runtime, parts)
    stages = stages_s(c, model, profile, r, precision, runtime)
    head_first = loss_on_first(r)
    if runtime.dualpipe:  # rank 0 holds the first and the last stage (RuntimeTraits.dualpipe);
        # without a pipeline the one stage is the whole model, head included
        piped = r.pp > 1
        ends = {k: np.where(piped, (stages[0][k] + stages[2][k]) / 2.0, stages[0][k])
                for k in stages[0]}
        # its once-per-step sums (sequence parallelism's norm gradients) cover both stages'
        # blocks, not their mean
        ends["layers"] = np.where(piped, stages[0]["layers"] + stages[2]["layers"],
                                  stages[0]["layers"])
        stages = [ends, stages[1], ends]
    per_mb = [s["compute"] + s["recompute"] + s["tp"] + s["cp"] + s["ep"] for s in stages]
    slowest = np.argmax(np.stack(per_mb), axis=0)
    crit = {k: np.choose(slowest, [s[k] for s in stages]) for k in stages[0]}
    crit["t_mb"] = np.choose(slowest, per_mb)
    # the bubble: a synchronous pipeline's first micro-batch crosses every rank before the
    # slowest runs the other m - 1, so the idle time is (sum of the ranks' t - t_max), which is
    # (pp - 1) t_max for equal ranks (Narayanan et al. 2021 §2.2). Every rank fills its share
    # in its own time: an embedding- or loss-only stage briefly, a lighter end stage less than
    # the slowest; ranks between the two ends are bounded by the largest.
    pp = np.maximum(r.pp, 2.0)
    filled = (per_mb[0] + per_mb[2] + (pp - 2.0) * per_mb[1] - crit["t_mb"]) / (pp - 1.0)
    crit["t_fill"] = np.minimum(filled, crit["t_mb"])
    crit["holds_head"] = np.choose(slowest, [head_first, 0.0 * head_first, 1.0 - head_first])
    if runtime.dualpipe:  # rank 0's last stage holds the head (and the final norm)
        crit["holds_head"] = np.where((r.pp > 1) & (slowest != 1), 1.0, crit["holds_head"])
    crit["norm_grad"] = c.tp.collectives["norm_grad"]
    return crit
