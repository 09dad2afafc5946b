"""Multi-token prediction (DeepSeek-V3 report §2.2): what its modules add to the stage that
computes the loss, per rank and micro-batch, in numpy. Zero for a model without MTP.

Each of the D = model.mtp_layers depths runs, on the loss stage: two RMSNorms, the projection
eh_proj (2h -> h) of the concatenated [norm(h_main); norm(embedding of the next token)], one
block of the kind block num_layers + d would be (MoE for DeepSeek-V3's layer 61), the shared
output head and its cross-entropy (report eqs. 21-24). step_time prices the block as one more
block of the stage (the mean block) and adds here what the MoE kind and the ends add.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost import compute, moe, params
from autoplan.cost.rows import Rows
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import ModelSpec


def mtp_is_moe(model: ModelSpec) -> bool:
    """The MTP block routes to experts (the block after the last is MoE)."""
    return model.moe is not None and model.moe.is_moe_layer(model.num_layers)


def extra_forward_s(model: ModelSpec, profile: ClusterProfile, gemm_peak: float, r: Rows
                    ) -> np.ndarray:
    """Forward seconds per micro-batch of all depths beyond one mean block each and the output
    head: eh_proj (2 * tokens * 2h * h FLOPs at the plan's GEMM peak, split by tp like a
    column-parallel GEMM) and, for a MoE block, its expert GEMMs beyond the mean block's share
    of them (the mean block carries moe_share of a MoE block's; cost/moe.py). Backward is twice
    it (two GEMMs per forward one)."""
    d = float(model.mtp_layers)
    if not d:
        return np.zeros_like(r.b)
    tokens = r.b * model.seq_len / r.cp
    h = model.hidden_size
    proj = 2.0 * tokens * 2 * h * h / r.tp
    shape = (tokens, h / r.tp)
    t = compute.gemm_time_s(proj, profile, gemm_peak, shape)
    if mtp_is_moe(model):
        t = t + (1.0 - moe.moe_share(model)) * moe.moe_block_forward_s(model, profile,
                                                                       gemm_peak, r)
    return d * t


def extra_all_to_all_s(model: ModelSpec, a2a_mean: np.ndarray) -> np.ndarray:
    """All-to-all seconds per micro-batch the MoE kind adds over the mean block's (which carries
    moe_share of a MoE block's dispatch and combine)."""
    if not model.mtp_layers or not mtp_is_moe(model):
        return np.zeros_like(a2a_mean)
    share = moe.moe_share(model)
    return model.mtp_layers * a2a_mean * (1.0 / share - 1.0)


def params_per_rank(model: ModelSpec, tp: np.ndarray, ep: np.ndarray, etp: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(non-expert, routed-expert) MTP parameters one GPU of the loss stage holds: the block and
    projection split over tp (MLA's down projections replicated, as params.params_per_rank),
    the routed experts over ep x etp; the shared embedding and head are the main model's."""
    tp, ep, etp = (np.asarray(x, float) for x in (tp, ep, etp))
    if not model.mtp_layers:
        return 0.0 * tp, 0.0 * tp
    rest, experts = params.mtp_block_params(model)
    whole = params.tp_replicated_params(model)
    d = model.mtp_layers
    return d * ((rest - whole) / tp + whole), d * experts / (ep * etp)


def extra_activation_bytes(model: ModelSpec, r: Rows) -> np.ndarray:
    """Bytes per micro-batch the depths keep beside their block's activations: the inputs of
    the two norms (h each) and of eh_proj (2h), 16-bit (4h elements, 8sbh bytes), split by tp
    under sequence parallelism as the block's replicated parts are (activations.py)."""
    sp_div = np.where(r.sp, r.tp, 1.0)
    return model.mtp_layers * 8.0 * r.b * model.seq_len / r.cp * model.hidden_size / sp_div
