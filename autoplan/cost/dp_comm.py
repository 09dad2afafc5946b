"""The data-parallel (ZeRO) collectives of a step and what hides them: each parameter group's
reductions and gathers over its shard group (dense parameters over dp, a MoE model's routed
experts over their expert-DP group), the windows of compute and NVLink-bound collectives they
overlap, and the step's small syncs.

step_time.py adds what is left exposed to the step; comm.py holds the collectives' formulas
and their sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autoplan.cost import comm, compute, memory
from autoplan.cost.block_time import fsdp_unit_host_s
from autoplan.cost.rows import Rows
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.cost.step_memory import held_expert_psi
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec


@dataclass(frozen=True)
class _ZeroTraffic:
    """One parameter group's ZeRO collectives per step, before overlap, and the compute each
    kind can hide behind (seconds per step)."""

    reductions: np.ndarray
    gathers: np.ndarray
    calls: np.ndarray
    """Collectives each kind is cut into (FSDP units, or DDP buckets at ZeRO-0)."""
    reduction_window: np.ndarray
    gather_window: np.ndarray
    reduction_compute_share: np.ndarray
    gather_compute_share: np.ndarray
    """Shares of each window that are compute (the rest: NVLink collectives, _beside_s):
    what hides there slows the compute beside it (comm.contention_s), what hides beside the
    other collectives slows no compute."""


def _zero_traffic(profile: ClusterProfile, r: Rows, runtime: RuntimeTraits,
                  crit: dict[str, np.ndarray], psi: np.ndarray, size: np.ndarray,
                  stride: np.ndarray) -> _ZeroTraffic:
    """The ZeRO collectives of `psi` parameters sharded over a group of `size` ranks `stride`
    apart.

    ZeRO >= 1 runs one collective per FSDP unit (each block and the root); ZeRO-0 one per
    25 MiB gradient bucket (torch DDP's bucket_cap_mb; Megatron's buckets are similar). Per
    step: ZeRO-0 all-reduces gradients; ZeRO-1 reduce-scatters once and all-gathers once;
    ZeRO-2 reduce-scatters every micro-batch; ZeRO-3 also gathers weights in forward and
    backward of every micro-batch. Under a pipeline that defers gradient sync
    (runtimes.PipelineGradSync) ZeRO-2/3 reduce-scatter once. HSDP (torchtitan's
    dp_replicate x dp_shard): each reduce-scatter inside the shard group is followed by an
    all-reduce of the 1/size gradient across the replicas, whose ranks sit stride x size apart
    (FSDP2's HSDP reduce, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).

    Windows (runtime.overlap_*): reductions hide behind the backward they follow (one
    micro-batch's, or every one's when they run each time; a pipeline engine's run after the
    last backward: none), gathers behind the forward they precede (once per step) or every
    forward and backward (ZeRO-3 per micro-batch). A group that crosses the network also
    hides behind the pass's exposed collectives that stay on NVLink (_beside_s), unstretched.

    A window is its compute stretched by the collectives beside it: compute of C seconds
    slowed by s while they run (efficiency.comm_slowdown) lasts C (1 + s) when they run beside
    all of it, so X seconds of collectives hide whole up to X = C (1 + s), and _dp_comm's
    contention, hidden * s / (1 + s), then makes the phase C + X s / (1 + s); beyond that the
    phase is X, the links' own time, with the slowed compute inside it. Without the stretch a
    link-bound phase would be charged its compute's slowdown on top of the link time.
    efficiency.overlap scales the window (1 in the datasheet profiles: the first gather and the
    last reduction, which nothing precedes or follows, are priced as exposed in _dp_comm)."""
    gpn = profile.gpus_per_node
    inside = comm.intra_node(stride, size, gpn)
    nodes = comm.members_per_node(stride, size, gpn)
    g_bytes = psi * r.reduce_bytes
    p_bytes = psi * r.weight_bytes
    calls = np.where(r.zero >= 1, r.layers_max + 1.0,
                     np.maximum(1.0, np.ceil(g_bytes / (memory.DDP_BUCKET_BYTES / 2))))

    def coll(kind: str, nbytes: np.ndarray) -> np.ndarray:
        return calls * comm.collective_time_s(kind, nbytes / calls, size, inside, profile,
                                              per_node=nodes)

    rs, ag, ar = (coll(comm.REDUCE_SCATTER, g_bytes), coll(comm.ALL_GATHER, p_bytes),
                  coll(comm.ALL_REDUCE, g_bytes))
    rep_stride = stride * size
    rs = rs + np.where(r.replicate > 1, calls * comm.collective_time_s(
        comm.ALL_REDUCE, g_bytes / size / calls, r.replicate,
        comm.intra_node(rep_stride, r.replicate, gpn), profile,
        per_node=comm.members_per_node(rep_stride, r.replicate, gpn)), 0.0)
    once = r.unsharded_accumulation | (r.zero <= 1)
    per_pass = r.zero == 3
    # compute windows are stretched by the slowdown (above), the NVLink collectives beside a
    # group that crosses nodes (_beside_s) are not
    beside_overlap = profile.efficiency.overlap
    overlap = beside_overlap * (1.0 + profile.efficiency.comm_slowdown)
    engine = (r.pp > 1) & runtime.pipeline_engine_reduce
    reductions = np.where(r.zero == 0, ar, np.where(once, 1.0, r.m) * rs)
    gathers = np.where(r.zero == 0, 0.0, np.where(per_pass, 2.0 * r.m, 1.0) * ag)
    fwd_beside, bwd_beside = _beside_s(crit, r, inside, gpn)
    # per micro-batch: the forward, the backward alone (what a reduction follows; its share of
    # the backward's collectives) and the backward with its recompute, as compute and beside
    fwd_c, fwd_b = crit["forward"] * overlap, fwd_beside * beside_overlap
    bwd_share = crit["backward"] / np.maximum(crit["backward"] + crit["recompute"], 1e-30)
    red_c = np.where(engine, 0.0, crit["backward"] * overlap)
    red_b = np.where(engine, 0.0, bwd_share * bwd_beside * beside_overlap)
    back_c = (crit["backward"] + crit["recompute"]) * overlap
    back_b = bwd_beside * beside_overlap
    reduction_window = red_c + red_b
    gather_window = fwd_c + fwd_b
    if runtime.chunked_dp_sync:
        chunked = once & (r.pp > 1) & (r.vpp > 1)
        j = np.arange(int(r.vpp.max(initial=1.0)))[:, None]  # chunk index, one row each
        reduction_window = np.where(chunked, chunked_hidden_s(
            reductions, reduction_window, r.vpp, j * r.pp), reduction_window)
        gather_window = np.where(chunked & ~per_pass, chunked_hidden_s(
            gathers, gather_window, r.vpp, np.minimum(1.0, j) * r.pp), gather_window)
    reduction_window = np.where(once, 1.0, r.m) * reduction_window
    # ZeRO-3 gathers every pass: the forward's gathers hide in the forward; the backward's
    # share the backward (and its recompute) with the reductions, which run first on the same
    # links (FSDP2 prefetches one unit ahead)
    per_pass_hidden = (np.minimum(gathers / 2.0, r.m * (fwd_c + fwd_b))
                       + np.minimum(gathers / 2.0, np.maximum(
                           0.0, r.m * (back_c + back_b) - np.minimum(reductions,
                                                                     reduction_window))))
    gather_c = np.where(per_pass, fwd_c + back_c, fwd_c)
    gather_b = np.where(per_pass, fwd_b + back_b, fwd_b)
    return _ZeroTraffic(
        reductions=reductions, gathers=gathers, calls=calls,
        reduction_window=reduction_window,
        gather_window=np.where(per_pass, per_pass_hidden, gather_window),
        reduction_compute_share=red_c / np.maximum(red_c + red_b, 1e-30),
        gather_compute_share=gather_c / np.maximum(gather_c + gather_b, 1e-30))


def _beside_s(crit: dict[str, np.ndarray], r: Rows, inside: np.ndarray, gpn: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per micro-batch of the critical stage's exposed tensor-parallel collectives and
    expert all-to-alls in its forward and in its backward (recompute in it) that a ZeRO group
    spanning nodes also hides behind: a pass's collectives stream on their own CUDA stream
    through its wall time (FSDP2's and Megatron's prefetch and bucketed reduce), and where the
    group crosses the network while the tensor-parallel or expert group stays inside a node,
    NVLink carries those and the network link is free beside them. A group inside a node
    shares their links and hides behind compute alone, as does every group beside collectives
    that cross nodes themselves."""
    spans = ~np.asarray(inside, bool)
    tp_in = spans & comm.intra_node(np.ones_like(r.tp), r.tp, gpn)
    ep_in = spans & comm.intra_node(r.etp, r.ep, gpn) & (r.ep > 1)
    # a stage priced without its collectives (a window given as compute alone) has none beside
    tp, tp_f, ep, ep_f = (crit.get(k, 0.0) for k in ("tp", "tp_forward", "ep", "ep_forward"))
    fwd = np.where(tp_in, tp_f, 0.0) + np.where(ep_in, ep_f, 0.0)
    bwd = np.where(tp_in, tp - tp_f, 0.0) + np.where(ep_in, ep - ep_f, 0.0)
    return fwd, bwd


def chunked_hidden_s(total: np.ndarray, own: np.ndarray, vpp: np.ndarray,
                     chunk_passes: np.ndarray) -> np.ndarray:
    """Seconds of a once-per-step collective of `total` seconds that the compute beside it
    hides when each of a rank's `vpp` model chunks runs its 1/vpp share on its own
    (RuntimeTraits.chunked_dp_sync): chunk j's share hides behind its own pass (`own`, the
    stage's overlap-weighted pass over all chunks, so own / vpp per chunk) and
    `chunk_passes[j]` further chunk passes (own / vpp each): the chunks' backward after chunk
    j's last one (j x pp), or the chunk forwards before a gathered chunk is needed (pp from
    chunk 1 on). Rows are chunk indices; chunks past a row's vpp count nothing."""
    vpp = np.asarray(vpp, float)
    j = np.arange(chunk_passes.shape[0])[:, None]
    share, per_pass = total / vpp, own / vpp
    hidden = np.minimum(share, (1.0 + chunk_passes) * per_pass)
    return np.sum(np.where(j < vpp, hidden, 0.0), axis=0)


def _dp_comm(profile: ClusterProfile, r: Rows, runtime: RuntimeTraits,
             crit: dict[str, np.ndarray], psi: np.ndarray,
             psi_experts: np.ndarray | None = None) -> np.ndarray:
    """Exposed seconds of the data-parallel (ZeRO) collectives per step: the dense
    parameters' over the ZeRO shard group (tp apart) and, for a MoE model, the routed
    experts' (`psi_experts`) over their own expert-DP group (ep x etp apart; Megatron-Core
    parallel folding), each as _zero_traffic counts them. Experts follow the dense stage: at
    ZeRO-1 the distributed optimizer reduces and gathers them once per step, at ZeRO-3 FSDP
    gathers them for every forward and backward and reduce-scatters every backward. FSDP2
    (torchtitan, autoplan's runtime) wraps them in fully_shard with their block; Megatron-FSDP
    does the same with optim_grads_params: its unit is the TransformerLayer, the experts are
    children of it with only their own buckets and expert-DP group, and grad_reduce_every_bprop
    holds for optim_grads and optim_grads_params (megatron-core 0.12-0.16,
    megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py, _post_backward and
    no_sync; param_and_grad_buffer.py, is_expert_param).

    Each group hides in its own window, and both together in no more than the larger (the
    once-per-step window is the last micro-batch's, inside the per-micro-batch one); with
    overlap (runtime.overlap_param_gather) one unit of each kind is always exposed (the first
    gather, the last reduction). FSDP2's copies around them are not hidden
    (RuntimeTraits.fsdp2_copies)."""
    groups = [_zero_traffic(profile, r, runtime, crit, psi, r.shard, r.tp)]
    held = psi
    has_dp = (r.shard > 1) | (r.replicate > 1)
    if psi_experts is not None:
        groups.append(_zero_traffic(profile, r, runtime, crit, psi_experts, r.expert_shard,
                                    r.ep * r.etp))
        held = psi + psi_experts
        has_dp = has_dp | (r.expert_shard > 1)

    def exposed(kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(all seconds of this kind, the seconds of it overlap hides)."""
        total = sum(getattr(g, kind + "s") for g in groups)
        hidden = np.minimum(sum(np.minimum(getattr(g, kind + "s"), getattr(g, kind + "_window"))
                                for g in groups),
                            np.max([getattr(g, kind + "_window") for g in groups], axis=0))
        return total, hidden

    def compute_share(kind: str) -> np.ndarray:
        """The groups' compute shares of their windows of this kind, weighted by window."""
        windows = [np.asarray(getattr(g, kind + "_window"), float) for g in groups]
        shares = [getattr(g, kind + "_compute_share") for g in groups]
        return (np.sum([w * s for w, s in zip(windows, shares, strict=True)], axis=0)
                / np.maximum(np.sum(windows, axis=0), 1e-30))

    (reductions, hide_red), (gathers, hide_gat) = exposed("reduction"), exposed("gather")
    calls = groups[0].calls
    if runtime.overlap_param_gather:
        exposed_red = np.maximum(reductions / calls, reductions - hide_red)
        exposed_gat = np.maximum(np.where(r.zero == 0, 0.0, gathers / calls), gathers - hide_gat)
    else:
        exposed_red, exposed_gat = reductions - hide_red, gathers
    once = r.unsharded_accumulation | (r.zero <= 1)
    # FSDP2's copy-out after each gather and copy-in before each reduction, on the compute
    # stream (RuntimeTraits.fsdp2_copies): read and write the 16-bit parameters; read the
    # 16-bit gradients and write them in the reduce dtype
    n_gathers = np.where(r.zero == 3, 2.0 * r.m, 1.0)
    copies = compute.memory_time_s(held * (n_gathers * 2.0 * r.weight_bytes + np.where(
        once, 1.0, r.m) * (r.weight_bytes + r.reduce_bytes)), profile)
    copies = np.where(runtime.fsdp2_copies & r.fsdp & (r.zero >= 1) & (r.shard > 1), copies,
                      0.0)
    # what overlap hides still slows the compute it runs beside (comm.contention_s); beside
    # the NVLink collectives of a pass (_beside_s) there is no compute to slow
    hidden = ((reductions - exposed_red) * compute_share("reduction")
              + np.maximum(0.0, gathers - exposed_gat) * compute_share("gather"))
    return np.where(has_dp, exposed_red + exposed_gat + comm.contention_s(hidden, profile),
                    0.0) + copies


def step_sync_s(profile: ClusterProfile, r: Rows, precision: str) -> np.ndarray:
    """Every step all-reduces the loss and the gradient norm over the whole job, and an fp16
    run its overflow verdict: tiny collectives that nothing hides."""
    gpn = profile.gpus_per_node
    syncs = 3.0 if precision == "fp16" else 2.0
    one = np.ones_like(r.world)
    return syncs * comm.collective_time_s(
        comm.ALL_REDUCE, np.full_like(r.world, 8.0), r.world, comm.intra_node(one, r.world, gpn),
        profile, per_node=comm.members_per_node(one, r.world, gpn))


def data_parallel_s(model: ModelSpec, profile: ClusterProfile, r: Rows, precision: str,
                    runtime: RuntimeTraits, crit: dict[str, np.ndarray], psi: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exposed seconds per step of the data-parallel traffic (ZeRO collectives, the step's
    syncs, FSDP2's host work per unit, the routed experts' own group), the parameters the rank
    steps (psi with its experts, in the dense group's shard) and the blocks it holds."""
    fsdp_host = r.m * fsdp_unit_host_s(r, runtime, profile)[1]
    # DualPipe: a rank reduces, gathers and steps its two stages (psi is the pair's: memory's
    # mem_psi), in units of both stages' blocks. Each stage's copies sit on two ranks of one
    # replica, so its gradient sums over 2 dp ranks, not dp: a ring moves (2dp - 1)/(2dp) of
    # the bytes instead of (dp - 1)/dp (0.4% more at dp 128), left unpriced
    paired = runtime.dualpipe & (r.pp > 1)
    held = np.where(paired, 2.0 * r.layers_max, r.layers_max)
    # routed experts: their own states and expert-DP group
    psi_e = held_expert_psi(model, r, runtime) if model.moe is not None else None
    out = (_dp_comm(profile, replace(r, layers_max=held), runtime, crit, psi, psi_e)
           + step_sync_s(profile, r, precision) + fsdp_host)
    if psi_e is not None:
        psi = psi + psi_e * np.where(r.zero >= 1, r.shard / r.expert_shard, 1.0)
    return out, psi, held
