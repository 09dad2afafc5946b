"""A block's tensor- and context-parallel communication per micro-batch, as its runtime runs and
overlaps it: the collectives (comm.py's formulas) a layer and a recomputed layer run, the share
overlap leaves exposed, and what Transformer Engine's userbuffers overlap costs the GEMMs beside
it. Apart from block_time.py, which joins these to the block's compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.cost import activations, comm, te_ring
from autoplan.cost.rows import Rows
from autoplan.cost.runtimes import RuntimeTraits
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec
from autoplan.plan_table import RC_FULL, RC_SELECTIVE

USERBUFFERS_BULK_SHARE = 0.5
"""Transformer Engine's userbuffers bulk overlaps (qkv_dgrad, qkv_wgrad, fc1_dgrad,
fc1_wgrad: 4 equal collectives, the 2 re-gathers of the norm outputs among them) as a share of
the 8 a block's sequence-parallel "layer" total prices (RuntimeTraits.tp_exposed_share): the
time their SMs run beside the GEMMs (comm.contention_s)."""


def userbuffers_margin_s(model: ModelSpec, profile: ClusterProfile, runtime: RuntimeTraits,
                         r: Rows, lt: dict[str, np.ndarray]) -> np.ndarray:
    """Extra forward seconds per block of the row-parallel GEMMs (attention output
    projection; the dense MLP's second) that Transformer Engine's pipelined userbuffers
    overlap runs beside its reduce-scatter with set_sm_margin: on sm_count - n SMs, so
    sm_count / (sm_count - n) times as long (RuntimeTraits.userbuffers_proj_sms,
    userbuffers_fc2_sms). Only where userbuffers runs (sequence parallelism, tp >= 2) on a
    profile that knows its SM count; a routed-expert MLP's GEMMs are grouped, not userbuffers'."""
    sms = profile.device.sm_count
    zero = 0.0 * lt["gemm_forward"]
    if runtime.tp_comm_overlap_method != "userbuffers" or not sms:
        return zero

    def slower(gemm: np.ndarray, n: int) -> np.ndarray:
        return gemm * (sms / (sms - min(n, sms - 1)) - 1.0)

    fc2 = slower(lt["fc2_gemm_forward"], runtime.userbuffers_fc2_sms) if model.moe is None \
        else zero
    on = np.asarray(r.sp, bool) & (np.asarray(r.tp, float) > 1)
    return np.where(on, slower(lt["proj_gemm_forward"], runtime.userbuffers_proj_sms) + fc2, 0.0)


@dataclass(frozen=True)
class TensorParallelCosts:
    """A block's tensor-parallel collectives per micro-batch, and what overlap can hide."""

    collectives: dict[str, np.ndarray]
    """comm.tensor_parallel_time_s: per layer, per recompute kind, embedding, head, norm_grad."""
    recompute: np.ndarray
    """The collectives a recomputed layer runs again."""
    exposed: np.ndarray
    """Share of a layer's collectives the runtime's overlap leaves exposed."""
    recompute_exposed: np.ndarray
    """Likewise for the recompute's collectives."""
    hideable: np.ndarray
    """GEMM seconds a layer's collectives can hide behind."""
    by_nccl: np.ndarray
    """The hidden collectives run on NCCL's SMs (False: userbuffers' pipelined overlap)."""
    userbuffers_bulk: np.ndarray
    """Share of a layer's collectives userbuffers runs as bulk overlaps on SMs of their own."""


def tensor_parallel_costs(model: ModelSpec, profile: ClusterProfile, r: Rows,
                          runtime: RuntimeTraits, lt: dict[str, np.ndarray],
                          parts: dict[str, np.ndarray]) -> TensorParallelCosts:
    """A block's tensor-parallel collectives, those a recomputed layer runs again, and how much
    of each the runtime's overlap can hide."""
    tokens = model.seq_len / r.cp * r.b
    gpn = profile.gpus_per_node
    tp_nodes = comm.members_per_node(np.ones_like(r.tp), r.tp, gpn)
    tpc = comm.tensor_parallel_time_s(model, r.weight_bytes * tokens * model.hidden_size,
                                      4.0 * tokens, r.tp, r.sp,
                                      comm.intra_node(np.ones_like(r.tp), r.tp, gpn), profile,
                                      per_node=tp_nodes)
    # Megatron's selective re-runs only the attention core on the Q, K, V it kept: no
    # collective again; the runtimes that re-run the norms re-gather their SP outputs
    selective_tp = 0.0 * tpc["recompute_selective"] if runtime.selective.value == \
        "attention-core" else tpc["recompute_selective"]
    full_tp = tpc["recompute_reentrant" if runtime.reentrant_recompute else "recompute_full"]
    by_module = r.rc_modules > 0
    tp_rec = np.where(r.recompute == RC_FULL, full_tp,
                      np.where(r.recompute == RC_SELECTIVE, np.where(
                          # Megatron re-runs the MLP under its reentrant checkpoint: fc1's
                          # gather and fc2's reduction, one MLP forward's (a quarter of the
                          # block's)
                          by_module, np.where((r.rc_modules & activations.MLP) > 0,
                                              parts.get("dense_share", 1.0)
                                              * tpc["layer"] / 4.0, 0.0),
                          selective_tp), 0.0))
    # NCCL's collectives slow the compute they hide behind (comm.contention_s); Transformer
    # Engine's userbuffers overlap runs its own kernels (ring exchanges on the copy engines)
    tp_by_nccl = np.where(runtime.tp_comm_overlap_method == "userbuffers",
                          runtime.tp_async_dgrad(r.tp, r.sp), True)
    return TensorParallelCosts(
        collectives=tpc, recompute=tp_rec,
        # what the runtime's overlap leaves exposed, never hiding more than the block's GEMMs
        # take (forward, plus backward's two GEMMs per forward one; the recomputed forward's
        # likewise)
        exposed=runtime.tp_exposed_share(r.tp, r.sp),
        recompute_exposed=runtime.tp_recompute_exposed_share(r.tp, r.sp),
        # async dgrad hides behind the column-parallel GEMMs' weight gradients only
        hideable=np.where(runtime.tp_async_dgrad(r.tp, r.sp), lt["column_gemm_forward"],
                          3.0 * lt["gemm_forward"]),
        by_nccl=tp_by_nccl,
        # userbuffers' bulk overlaps (4 of a block's 10 collectives, the QKV and fc1 backward)
        # run on SMs of their own beside the GEMM, as NCCL does; its ring exchanges copy on the
        # copy engines and its pipelined reduce-scatters keep their SMs apart
        # (userbuffers_margin_s)
        userbuffers_bulk=np.where(tp_by_nccl, 0.0, USERBUFFERS_BULK_SHARE))


def context_parallel_costs(model: ModelSpec, profile: ClusterProfile, r: Rows,
                           runtime: RuntimeTraits, lt: dict[str, np.ndarray], precision: str
                           ) -> tuple[np.ndarray, np.ndarray]:
    """A block's exposed context-parallel exchanges, and those a recomputed layer runs again
    (none where its recompute.modules keep the attention core), as the runtime exchanges K/V
    (RuntimeTraits.cp_exchange)."""
    gpn = profile.gpus_per_node
    cp_inside = comm.intra_node(r.tp, r.cp, gpn)
    cp_nodes = comm.members_per_node(r.tp, r.cp, gpn)
    keeps_core = (r.rc_modules > 0) & ((r.rc_modules & activations.CORE_ATTN) == 0)
    if runtime.cp_exchange == "torch-ring":
        width = model.q_width if runtime.kv_repeated else model.kv_heads * model.head_width
        kv_bytes = 2.0 * r.weight_bytes * model.seq_len * r.b * width / r.tp
        ring = comm.torch_ring_time_s(kv_bytes, r.cp, lt["core_forward"] / r.cp,
                                      lt["core_backward"] / r.cp, cp_inside, profile,
                                      per_node=cp_nodes)
        # a recomputed attention core runs the forward ring again
        return ring["forward"] + ring["backward"], np.where(keeps_core, 0.0, ring["forward"])
    if runtime.cp_exchange == "te-p2p":
        ring = te_ring.ring_time_s(model, profile, r, precision, runtime, cp_inside)
        return ring["forward"] + ring["backward"], np.where(keeps_core, 0.0, ring["forward"])
    cp_layer = comm.context_parallel_time_s(model, r.b, r.tp, r.cp, r.weight_bytes, cp_inside,
                                            profile, per_node=cp_nodes)
    cp_rec = comm.context_parallel_time_s(model, r.b, r.tp, r.cp, r.weight_bytes, cp_inside,
                                          profile, recompute_gathers=1.0,
                                          per_node=cp_nodes) - cp_layer
    return cp_layer, np.where(keeps_core, 0.0, cp_rec)
