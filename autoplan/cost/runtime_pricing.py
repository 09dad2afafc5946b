"""What RuntimeTraits mean for one plan: bytes per gradient and per logit at its precision, the
share of tensor-parallel communication the runtime leaves exposed, and the offloads it refuses.
"""

from __future__ import annotations

import numpy as np

from autoplan.cost.runtime_kinds import (
    LOSS_CAST_BYTES,
    METRIC_PASS_BYTES,
    METRIC_PASS_LIVE_BYTES,
    OFFLOAD_MODES,
)


class TraitsPricing:
    """The methods of RuntimeTraits that read its fields for a plan (runtime_traits.py declares
    and documents the fields; those these methods read are named here for the type checker)."""

    name: str
    offload: tuple[str, ...]
    offload_zero_stages: tuple[int, ...]
    tp_comm_overlap: float
    tp_comm_overlap_method: str
    attention_compute_dtype: str | None
    grad_bytes_bf16: float
    grad_bytes_fp16: float
    reduce_bytes_bf16: float
    reduce_bytes_fp16: float
    loss_bytes_per_logit: float
    loss_casts: bool
    train_metric_passes: int

    def offload_refusal(self, optimizer: bool, params: bool,
                        zero_stage: int | None = None) -> str | None:
        """Why the runtime cannot run this offload (at this ZeRO stage, where given), or None."""
        mode = {(True, True): "both", (True, False): "optimizer", (False, True): "params"}.get(
            (optimizer, params))
        if mode is None:
            return None
        if mode not in self.offload:
            runs = "; ".join(OFFLOAD_MODES[m] for m in self.offload) or "nothing"
            return f"runtime {self.name} cannot offload {OFFLOAD_MODES[mode]} (it offloads {runs})"
        if optimizer and zero_stage is not None and zero_stage not in self.offload_zero_stages:
            stages = ", ".join(map(str, self.offload_zero_stages))
            return (f"runtime {self.name} offloads the optimizer at ZeRO stage {stages} only "
                    f"(got zero_stage {zero_stage}; set zero_stage {self.offload_zero_stages[0]})")
        # the least stage each mode needs is a plan rule (plan_rules, offload-*)
        return None

    def tp_exposed_share(self, tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """Share of a block's tensor-parallel collective time left exposed, as far as the GEMMs
        beside it are long enough to hide the rest (the caller caps the hidden time by them).

        `userbuffers` follows Transformer Engine's default overlap methods per GEMM
        (transformer_engine/pytorch/module/base.py, initialize_ub: ring_exchange for qkv_fprop,
        fc1_fprop, proj_dgrad, fc2_dgrad; pipeline for proj_fprop, fc2_fprop; bulk for the
        qkv/fc1 dgrad and wgrad). A block runs ten sequence-parallel collectives of equal size
        (forward: 2 all-gathers, 2 reduce-scatters; backward: 2 all-gathers of the output
        gradient, 2 re-gathers of the norm outputs, 2 reduce-scatters of the input gradients),
        of which the cost model prices eight (comm.tensor_parallel_collectives' "layer": the
        re-gathers, bulk-overlapped wherever Megatron re-gathers, are never exposed). A ring
        exchange leaves its first of tp chunks exposed, a pipelined reduce-scatter its last of
        num_splits = 4 (Megatron-Bridge's userbuffers presets), a bulk overlap none: exposed
        = (4/tp + 2/4) collectives of the eight priced. Userbuffers needs sequence parallelism
        (Megatron-Bridge refuses tp_comm_overlap without it)."""
        tp, sp = np.asarray(tp, float), np.asarray(sp, bool)
        # async dgrad: of a block's 4 all-reduces (forward: attention and MLP outputs;
        # backward: the QKV and fc1 input gradients) the 2 backward ones hide behind their
        # weight-gradient GEMMs; with SP, 2 of its 8 collectives (the input-gradient
        # reduce-scatters). Userbuffers runs on the same Transformer Engine modules and falls
        # back to it where it does not apply (no SP).
        async_dgrad = np.where(sp, 6.0 / 8.0, 2.0 / 4.0) + np.zeros_like(tp)
        if self.tp_comm_overlap_method == "userbuffers":
            exposed = (4.0 / np.maximum(tp, 1.0) + 2.0 / 4.0) / 8.0
            return np.where(_userbuffers_apply(tp, sp), exposed, async_dgrad)
        if self.tp_comm_overlap_method == "async-dgrad":
            return async_dgrad
        return np.full_like(tp, 1.0 - self.tp_comm_overlap)

    def tp_async_dgrad(self, tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """Where the overlap is async dgrad, which hides only behind the column-parallel GEMMs'
        weight gradients (userbuffers without SP falls back to it)."""
        tp = np.asarray(tp, float)
        if self.tp_comm_overlap_method == "userbuffers":
            return ~_userbuffers_apply(tp, sp)
        return np.full(tp.shape, self.tp_comm_overlap_method == "async-dgrad")

    def tp_recompute_exposed_share(self, tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """The same for the forward collectives a recompute repeats: userbuffers overlaps them
        as it does the first forward; async dgrad overlaps backward collectives only."""
        tp = np.asarray(tp, float)
        if self.tp_comm_overlap_method == "userbuffers":
            return np.where(_userbuffers_apply(tp, sp), self.tp_exposed_share(tp, sp), 1.0)
        if self.tp_comm_overlap_method == "async-dgrad":
            return np.ones_like(tp)
        return self.tp_exposed_share(tp, sp)

    def attention_precision(self, precision: str) -> str:
        """The precision a plan's fused attention core runs in: fp8 runs keep attention in
        bf16 (Transformer Engine, torchao: fp8 GEMMs only), and `attention_compute_dtype`, where
        set, replaces a 16-bit one."""
        core = "bf16" if precision == "fp8" else precision
        if self.attention_compute_dtype is not None and core in ("bf16", "fp16"):
            return self.attention_compute_dtype
        return core

    def grad_bytes(self, precision: str) -> float:
        """Bytes per gradient element kept on the device (fp8 runs keep bf16's)."""
        if precision == "fp32":
            return 4.0
        return self.grad_bytes_fp16 if precision == "fp16" else self.grad_bytes_bf16

    def loss_bytes(self, precision: str, metrics: bool = True) -> float:
        """HBM bytes per logit of the loss and the trainer's metric passes over the logits:
        loss_bytes_per_logit for this precision (fp32 logits need no upcast forward and no cast
        back, LOSS_CAST_BYTES fewer; a kernel without casts moves twice the bytes), plus, with
        `metrics` (the main head's logits; not an MTP head's), train_metric_passes
        cross-entropy forwards of METRIC_PASS_BYTES (no upcast in fp32)."""
        metric = float(metrics) * self.train_metric_passes * (
            METRIC_PASS_BYTES - (LOSS_CAST_BYTES / 2.0 if precision == "fp32" else 0.0))
        if precision != "fp32":
            own = self.loss_bytes_per_logit
        elif self.loss_casts:
            own = self.loss_bytes_per_logit - LOSS_CAST_BYTES
        else:
            own = 2.0 * self.loss_bytes_per_logit
        return own + metric

    def metric_live_bytes(self, precision: str) -> float:
        """Bytes per logit alive during the trainer's metric passes (METRIC_PASS_LIVE_BYTES;
        fp32 logits need no upcast), 0 without them."""
        if not self.train_metric_passes:
            return 0.0
        return METRIC_PASS_LIVE_BYTES - (2.0 if precision == "fp32" else 0.0)

    def reduce_bytes(self, precision: str) -> float:
        """Bytes per gradient element sent in data-parallel reductions."""
        if precision == "fp32":
            return 4.0
        return self.reduce_bytes_fp16 if precision == "fp16" else self.reduce_bytes_bf16


def _userbuffers_apply(tp: np.ndarray, sp: np.ndarray) -> np.ndarray:
    """Where Transformer Engine's userbuffers overlap runs: sequence parallelism at tp >= 2
    (elsewhere its modules fall back to async dgrad)."""
    return np.asarray(sp, bool) & (np.asarray(tp, float) > 1)
