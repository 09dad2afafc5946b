"""Compose the cost terms into memory per GPU, step time by part, throughput, MFU and HFU.

`estimate_table` scores a whole table of candidates in one numpy pass; `estimate_plan` scores one
Plan and explains it (CostEstimate). Pipeline stages are scored at the first stage (embedding,
the most micro-batches in flight), the most loaded and the last (output layer, fp32 logits);
memory is the worst stage's and the step time follows the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplan.cost import comm, compute, memory, offload, params, pipeline
from autoplan.hardware import ClusterProfile, ClusterSpec, load_profile
from autoplan.model_spec import ModelSpec, NormKind
from autoplan.plan import Plan
from autoplan.plan_table import (
    GPIPE,
    INTERLEAVED,
    RC_FULL,
    RC_NONE,
    RC_SELECTIVE,
    ZERO_BUBBLE,
    Table,
    col,
    plan_to_row,
)

MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "buffers", "allocator", "reserved")
TIME_PARTS = ("compute", "recompute", "tp_comm", "cp_comm", "pp_bubble", "pp_comm", "dp_comm", "offload",
              "optimizer")
ADAM_BYTES_PER_PARAM = 28.0
"""HBM traffic of a fused Adam step per parameter: fp32 master, m and v read and written (24),
16-bit gradient read and weight written (4)."""


def _recomputed_layers(layers: np.ndarray, rc: np.ndarray, rc_layers: np.ndarray,
                       vpp: np.ndarray) -> np.ndarray:
    all_or_some = np.where(rc_layers < 0, layers, np.minimum(rc_layers * vpp, layers))
    return np.where(rc == RC_NONE, 0, all_or_some).astype(float)


def estimate_table(
    table: Table, model: ModelSpec, profile: ClusterProfile, precision: str = "bf16",
    attention: str = "flash",
) -> dict[str, np.ndarray]:
    """Score every row of `table` (see autoplan.plan_table.COLUMNS); returns named columns:
    mem_<part> and mem_total / mem_host (bytes per GPU), time_<part> and time_step (seconds),
    tokens_per_s, model_flops_per_step, mfu, hfu, fits."""
    dp, tp, pp, cp, vpp = (col(table, k).astype(float) for k in ("dp", "tp", "pp", "cp", "vpp"))
    sp, sched, zero = col(table, "sp").astype(bool), col(table, "schedule"), col(table, "zero_stage")
    off_o, off_p = col(table, "offload_optimizer"), col(table, "offload_params")
    rc, rcl = col(table, "recompute"), col(table, "recompute_layers")
    b, gbs = col(table, "mbs").astype(float), col(table, "gbs").astype(float)
    l_max = col(table, "layers_max").astype(float)
    l_first = col(table, "layers_first").astype(float)
    l_last = col(table, "layers_last").astype(float) if "layers_last" in table else l_max
    eager = attention == "eager"
    dev, gpn = profile.device, profile.gpus_per_node
    world = dp * tp * pp * cp
    m = np.maximum(np.floor(gbs / (dp * b)), 1.0)
    shard = dp * cp
    w_bytes = 4.0 if precision == "fp32" else 2.0
    act_scale = 2.0 if precision == "fp32" else 1.0
    vocab = params.padded_vocab(model, tp).astype(float)
    # FSDP2 wraps every data-parallel plan but fp32 ZeRO-0 without pipeline/tensor/context
    # parallelism (which runs on DDP), and every mixed-precision or offloaded plan
    # (autoplan.runtime.data_parallel.uses_fsdp)
    ddp = ((zero == 0) & (dp > 1) & (pp == 1) & (tp == 1) & (cp == 1) & (precision == "fp32")
           & ~(off_o | off_p))
    fsdp = ~ddp & ((shard > 1) | (precision != "fp32") | off_o | off_p)

    # ---- memory -------------------------------------------------------------------------
    psi_first, psi_last = params.params_per_rank(model, tp, pp, l_first, l_last)
    # Zero-bubble's V schedule (two chunks per rank) puts the last stage on rank 0 beside the
    # first (Qi et al. 2024, ZB-V): the output head, its logits and the loss live there.
    v_shape = (sched == ZERO_BUBBLE) & (vpp == 2) & (pp > 1)
    head = vocab * model.hidden_size / tp
    psi_first = psi_first + np.where(v_shape, head, 0.0)
    psi_last = psi_last - np.where(v_shape, head, 0.0)
    acc = (zero >= 2) & (pp > 1)
    st_first = memory.model_state_bytes(psi_first, zero, shard, precision, off_o, off_p,
                                        unsharded_accumulation=acc)
    st_last = memory.model_state_bytes(psi_last, zero, shard, precision, off_o, off_p,
                                       unsharded_accumulation=acc)
    parts = memory.activation_elements_per_layer(model, b, tp, sp, cp, eager)
    a_none = memory.activation_bytes_per_layer(parts, np.zeros_like(rc), precision)
    a_pol = memory.activation_bytes_per_layer(parts, rc, precision)

    def act_layers(layers: np.ndarray) -> np.ndarray:
        n = _recomputed_layers(layers, rc, rcl, vpp)
        return n * a_pol + (layers - n) * a_none

    in_flight = pipeline.in_flight_microbatches(sched, pp, vpp, m)
    in_flight_last = np.where(sched == GPIPE, m, np.where(sched == INTERLEAVED, in_flight, 1.0))
    working = a_none * np.where(rc != RC_NONE, 2.0, 1.0)
    sp_div = np.where(sp, tp, 1.0)
    embed_act = 3.0 * model.seq_len / cp * b * model.hidden_size / sp_div * act_scale
    logits = memory.logits_bytes(model, b, tp, vocab, cp, np.where(sched == GPIPE, m, 1.0))
    single = pp == 1
    loss_first = single | v_shape
    # an uneven split is scored as if its largest stage held rank 0's micro-batches: an upper
    # bound on every rank's layers x micro-batches in flight, equal to it for an even split
    act_first = (in_flight * (act_layers(l_max) + embed_act) + working
                 + np.where(loss_first, logits, 0))
    act_last = np.where(single, act_first, in_flight_last * act_layers(l_last) + working
                        + np.where(v_shape, 0.0, logits))

    has_dp = shard > 1
    zero3_gather = np.where((zero == 3) & has_dp, 3.0 * w_bytes * params.layer_params(model) / tp, 0)
    buffers = (np.where(has_dp & (zero < 3), memory.DDP_BUCKET_BYTES, 0.0) + zero3_gather
               + np.where(off_o | off_p, memory.DDP_BUCKET_BYTES, 0.0))

    def total(st: dict[str, np.ndarray], act: np.ndarray) -> np.ndarray:
        frag = memory.FRAGMENTATION * (act + buffers)
        return st["params"] + st["grads"] + st["optimizer"] + act + buffers + frag + dev.reserved_bytes

    tot_first, tot_last = total(st_first, act_first), total(st_last, act_last)
    worst_first = tot_first >= tot_last

    def pick(a: np.ndarray, c: np.ndarray) -> np.ndarray:
        return np.where(worst_first, a, c)

    act = pick(act_first, act_last)
    out: dict[str, np.ndarray] = {
        "mem_params": pick(st_first["params"], st_last["params"]),
        "mem_grads": pick(st_first["grads"], st_last["grads"]),
        "mem_optimizer": pick(st_first["optimizer"], st_last["optimizer"]),
        "mem_activations": act,
        "mem_buffers": buffers + 0.0 * act,
        "mem_allocator": memory.FRAGMENTATION * (act + buffers),
        "mem_reserved": np.full_like(act, float(dev.reserved_bytes)),
        "mem_total": np.maximum(tot_first, tot_last),
    }
    psi = np.maximum(psi_first, psi_last)
    gpus_per_host = np.minimum(world, gpn)
    host = memory.host_state_bytes(psi, shard, precision, off_o, off_p)
    out["mem_host"] = host
    out["fits"] = (out["mem_total"] <= dev.memory_bytes) & (
        host * gpus_per_host <= profile.host.memory_bytes)

    # ---- time per micro-batch on the slowest stage ---------------------------------------
    peak = dev.peak(precision)
    lt = compute.layer_times_s(
        model, profile, peak, b, tp, cp, (parts["replicated"] + parts["split"]) * act_scale,
        parts["core"] * act_scale, eager)
    rec_extra = np.where(rc == RC_SELECTIVE, lt["selective"], np.where(rc == RC_FULL, lt["full"], 0))
    tokens = model.seq_len / cp * b
    tpc = comm.tensor_parallel_time_s(model, w_bytes * tokens * model.hidden_size, 4.0 * tokens,
                                      tp, sp, comm.intra_node(np.ones_like(tp), tp, gpn), profile)
    tp_rec = np.where(rc == RC_FULL, tpc["recompute_full"],
                      np.where(rc == RC_SELECTIVE, tpc["recompute_selective"], 0.0))
    cp_inside = comm.intra_node(tp, cp, gpn)
    cp_layer = comm.context_parallel_time_s(model, b, tp, cp, w_bytes, cp_inside, profile)
    # a recomputed block gathers K and V again
    cp_rec = comm.context_parallel_time_s(model, b, tp, cp, w_bytes, cp_inside, profile,
                                          recompute_gathers=1.0) - cp_layer
    logit_t = compute.logits_times_s(model, profile, peak, b, tp, cp, vocab, logits)

    def stage(layers: np.ndarray, extra: np.ndarray, tp_ends: np.ndarray) -> dict[str, np.ndarray]:
        n = _recomputed_layers(layers, rc, rcl, vpp)
        return {
            "compute": layers * (lt["forward"] + lt["backward"] + lt["dtensor"]) + extra,
            "recompute": n * rec_extra,
            "tp": layers * tpc["layer"] + n * tp_rec + tp_ends,
            "cp": layers * cp_layer + n * cp_rec,
            "backward": layers * lt["backward"],
        }

    head_first = np.where(loss_first, 1.0, 0.0)
    stages = [stage(l_first, head_first * logit_t, tpc["embedding"] + head_first * tpc["head"]),
              stage(l_max, 0.0 * l_max, 0.0 * l_max),
              stage(l_last, (1.0 - head_first) * logit_t, (1.0 - head_first) * tpc["head"])]
    per_mb = [s["compute"] + s["recompute"] + s["tp"] + s["cp"] for s in stages]
    slowest = np.argmax(np.stack(per_mb), axis=0)
    crit = {k: np.choose(slowest, [s[k] for s in stages]) for k in stages[0]}
    t_mb = np.choose(slowest, per_mb)

    out["time_compute"] = m * crit["compute"]
    out["time_recompute"] = m * crit["recompute"]
    # sequence parallelism's partial norm gradients: summed once per step by the trainer, or
    # per micro-batch where FSDP reduces every micro-batch (ZeRO-2/3: FSDP2 redistributes a
    # Partial gradient to Replicate inside its reduce-scatter)
    per_norm = 2.0 if model.norm is NormKind.LAYERNORM else 1.0
    holds_head = np.choose(slowest, [head_first, 0.0 * head_first, 1.0 - head_first])
    norm_tensors = per_norm * (2.0 * np.choose(slowest, [l_first, l_max, l_last]) + holds_head)
    out["time_tp_comm"] = m * crit["tp"] + norm_tensors * tpc["norm_grad"] * np.where(
        fsdp & (zero >= 2), m, 1.0)
    out["time_cp_comm"] = m * crit["cp"]
    out["time_pp_bubble"] = pipeline.bubble_fraction(sched, pp, vpp, m) * m * t_mb
    p2p_bytes = w_bytes * model.seq_len / cp * b * model.hidden_size / sp_div
    # a pipeline that spans nodes sends some boundaries over the network: price the slowest
    p2p = comm.p2p_time_s(p2p_bytes, comm.intra_node(tp * cp * dp, pp, gpn), profile)
    out["time_pp_comm"] = np.where(pp > 1, 2.0 * (m * vpp + pp - 1.0) * p2p, 0.0)


    # ---- data parallel / ZeRO communication ------------------------------------------------
    dp_inside = comm.intra_node(tp, shard, gpn)
    grad_bytes = memory.state_bytes_per_param(precision)[1]  # reduced in fp32 (see memory.py)
    g_bytes, p_bytes = psi * grad_bytes, psi * w_bytes

    # ZeRO >= 1 runs one collective per FSDP unit (each block and the root); ZeRO-0 one per
    # 25 MiB gradient bucket (torch DDP's bucket_cap_mb; Megatron's buckets are similar)
    calls = np.where(zero >= 1, l_max + 1.0,
                     np.maximum(1.0, np.ceil(g_bytes / (memory.DDP_BUCKET_BYTES / 2))))

    def coll(kind: str, nbytes: np.ndarray) -> np.ndarray:
        return calls * comm.collective_time_s(kind, nbytes / calls, shard, dp_inside, profile)

    rs, ag = coll(comm.REDUCE_SCATTER, g_bytes), coll(comm.ALL_GATHER, p_bytes)
    dp_total = np.choose(np.clip(zero, 0, 3), [
        coll(comm.ALL_REDUCE, g_bytes), rs + ag, m * rs + ag, m * (rs + 2.0 * ag)])
    # host work of the runtime's FSDP2 units per micro-batch: each block and one root per chunk
    eff = profile.efficiency
    fsdp_host = np.where(fsdp, m * (l_max + vpp) * eff.fsdp_unit_overhead_s, 0.0)
    if model.tie_embeddings:  # first and last stage sum their copies' (FSDP-sharded) gradients;
        # under ZB-V both copies sit on rank 0 and add up locally
        tied = head * grad_bytes / np.where(fsdp & (zero >= 1), shard, 1.0)
        out["time_pp_comm"] += np.where((pp > 1) & ~v_shape, comm.collective_time_s(
            comm.ALL_REDUCE, tied, np.full_like(pp, 2.0), comm.intra_node(tp * cp * dp, pp, gpn),
            profile), 0.0)
    # every step all-reduces the loss and the gradient norm over the whole job, and an fp16
    # run its overflow verdict: tiny collectives that nothing hides
    syncs = 3.0 if precision == "fp16" else 2.0
    step_sync = syncs * comm.collective_time_s(comm.ALL_REDUCE, np.full_like(world, 8.0), world,
                                             comm.intra_node(np.ones_like(world), world, gpn),
                                             profile)
    hideable = np.where(zero >= 2, m * t_mb, crit["backward"]) * profile.efficiency.overlap
    out["time_dp_comm"] = (dp_total - np.minimum(dp_total * profile.efficiency.overlap, hideable)
                           + step_sync + fsdp_host)

    # ---- offload and the optimizer step -----------------------------------------------------
    shard_params = psi / np.where(zero >= 1, shard, 1.0)
    out["time_offload"] = (
        np.where(off_o, offload.optimizer_offload_time_s(
            shard_params, gpus_per_host, w_bytes, profile,
            crit["backward"] * profile.efficiency.overlap), 0.0)
        + np.where(off_p, offload.param_offload_time_s(
            psi / shard, m, w_bytes, profile, m * t_mb * profile.efficiency.overlap), 0.0))
    tensors = l_max * params.tensors_per_layer(model) + params.end_tensors(model)
    out["time_optimizer"] = np.where(
        off_o, 0.0, compute.memory_time_s(shard_params * ADAM_BYTES_PER_PARAM, profile)
    ) + tensors * (eff.optimizer_overhead_s + np.where(
        fsdp | (tp > 1), eff.dtensor_optimizer_overhead_s, 0.0))
    slots = profile.host.compute_slots
    if slots:  # more ranks than cores on a node time-share them (CPU runs)
        share = np.maximum(1.0, np.minimum(world, gpn) / slots)
        for k in TIME_PARTS:
            out[f"time_{k}"] = out[f"time_{k}"] * share
    out["time_step"] = np.sum([out[f"time_{k}"] for k in TIME_PARTS], axis=0)

    # ---- throughput and utilisation ---------------------------------------------------------
    per_seq = compute.model_flops_per_sequence(model)
    out["model_flops_per_step"] = gbs * per_seq
    one = np.array(1.0)
    fwd_layer = np.sum(compute.gemm_flops_per_layer(model, np.array(float(model.seq_len)), one))
    fwd_core = compute.attention_core_flops(model, one, one, one)
    frac = _recomputed_layers(l_first, rc, rcl, vpp) / np.maximum(l_first, 1)
    rec_flops = gbs * model.num_layers * frac * np.where(
        rc == RC_FULL, fwd_layer + fwd_core, np.where(rc == RC_SELECTIVE, fwd_core, 0.0))
    out["tokens_per_s"] = gbs * model.seq_len / out["time_step"]
    out["mfu"] = out["model_flops_per_step"] / (out["time_step"] * world * peak)
    out["hfu"] = (out["model_flops_per_step"] + rec_flops) / (out["time_step"] * world * peak)
    return out


@dataclass(frozen=True)
class CostEstimate:
    """The cost model's answer for one plan, in the shape `estimate --format json` prints."""

    feasible: bool
    reasons: tuple[str, ...]
    memory: dict[str, float]
    time: dict[str, float]
    tokens_per_s: float
    model_flops_per_step: float
    mfu: float
    hfu: float
    num_params: int
    dominant: str
    """The largest part of the step time."""
    days_to_train: float | None = None

    @property
    def step_time_s(self) -> float:
        return self.time["step"]

    @property
    def memory_total_bytes(self) -> float:
        return self.memory["total"]


def row_estimate(cols: dict[str, np.ndarray], i: int = 0) -> dict[str, Any]:
    """Row i of estimate_table's output as nested {memory, time, ...} floats."""
    mem = {k: float(cols[f"mem_{k}"][i]) for k in MEMORY_PARTS}
    mem["total"] = float(cols["mem_total"][i])
    mem["host_total"] = float(cols["mem_host"][i])
    tim = {k: float(cols[f"time_{k}"][i]) for k in TIME_PARTS}
    tim["step"] = float(cols["time_step"][i])
    return {
        "memory": mem, "time": tim, "tokens_per_s": float(cols["tokens_per_s"][i]),
        "model_flops_per_step": float(cols["model_flops_per_step"][i]),
        "mfu": float(cols["mfu"][i]), "hfu": float(cols["hfu"][i]),
        "dominant": max(TIME_PARTS, key=lambda k: tim[k]), "fits": bool(cols["fits"][i]),
    }


def estimate_plan(
    plan: Plan, cluster: ClusterSpec | None = None, model: ModelSpec | None = None,
    train_tokens: float | None = None,
) -> CostEstimate:
    """Score one plan: validity reasons, memory by part, time by part, throughput and MFU."""
    from autoplan.cost.params import total_params
    from autoplan.plan_rules import validate_plan

    model = model or plan.model_spec()
    cluster = cluster or ClusterSpec(load_profile(plan.cluster.profile), plan.cluster.num_gpus)
    reasons = validate_plan(plan, model, cluster)
    precision = plan.precision.value
    if precision not in cluster.profile.device.peak_flops_per_s:
        precision = next(iter(cluster.profile.device.peak_flops_per_s))  # reason already given
    cols = estimate_table(plan_to_row(plan, model), model, cluster.profile, precision,
                          plan.attention.value)
    row = row_estimate(cols)
    capacity = cluster.profile.device.memory_bytes
    total = row["memory"]["total"]
    if total > capacity:
        reasons.append(
            f"needs {total / 2**30:.1f} GiB per GPU of {capacity / 2**30:.1f} GiB "
            f"(short by {(total - capacity) / 2**30:.1f} GiB)")
    host_need = row["memory"]["host_total"] * min(cluster.num_gpus, cluster.profile.gpus_per_node)
    if host_need > cluster.profile.host.memory_bytes:
        reasons.append(
            f"offloaded states need {host_need / 2**30:.1f} GiB of host memory per node of "
            f"{cluster.profile.host.memory_bytes / 2**30:.1f} GiB")
    row["memory"]["capacity"] = float(capacity)
    row["memory"]["shortfall"] = float(max(0.0, total - capacity))
    days = None
    if train_tokens is not None:
        days = train_tokens / row["tokens_per_s"] / 86400.0
    return CostEstimate(
        feasible=not reasons, reasons=tuple(reasons), memory=row["memory"], time=row["time"],
        tokens_per_s=row["tokens_per_s"], model_flops_per_step=row["model_flops_per_step"],
        mfu=row["mfu"], hfu=row["hfu"], num_params=total_params(model), dominant=row["dominant"],
        days_to_train=days,
    )
