"""The candidate table's columns as the quantities the cost terms need, derived once.

`Rows` names every column as the papers do (dp, tp, pp, cp, v, b, m, L per stage) and holds the
facts several terms share: micro-batches per step, the FSDP/DDP choice the runtime makes, where
pipeline stages sit, the bytes of a weight and of a gradient on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autoplan.cost import params
from autoplan.cost.runtimes import PipelineGradSync, RuntimeTraits
from autoplan.model_spec import ModelSpec
from autoplan.plan_rules import data_parallel_wrappers
from autoplan.plan_table import RC_NONE, RC_UNIFORM, ZERO_BUBBLE, Table, col, dp_col, expert_col

BF16_OPTIMIZER_GRAD_BYTES = 6.0
"""Gradient bytes per parameter DeepSpeed's BF16_Optimizer holds under a pipeline: its fp32
accumulation buffer (fp32_groups_gradients_flat, 4, unsharded) and the 16-bit param.grad
(2), which the pipeline engine keeps between backward passes: `_exec_backward_pass` calls
optimizer.clear_lp_grads() before each micro-batch's backward and
update_hp_grads(clear_lp_grads=False) after it (deepspeed/runtime/pipe/engine.py;
deepspeed/runtime/bf16_optimizer.py)."""
BF16_OPTIMIZER_ACCUMULATE_BYTES = 18.0
"""HBM bytes per parameter of BF16_Optimizer.update_hp_grads, once per micro-batch:
`hp.grad.add_(lp.grad.to(hp.dtype))` per tensor reads the 16-bit gradient (2) and writes its
fp32 copy (4), then reads the copy and the fp32 accumulator (4 + 4) and writes the sum (4)."""
BF16_ACCUMULATE_BYTES = 6.0
"""The same into a bf16 accumulator (grad_accum_dtype the model's own): `.to()` of the same
dtype copies nothing, so the add reads 2 + 2 and writes 2."""


def bf16_optimizer_accumulation(pp: np.ndarray, zero: np.ndarray, default_reduce: np.ndarray,
                                offload_optimizer: np.ndarray
                                ) -> tuple[np.ndarray, np.ndarray]:
    """(fp32, bf16): where DeepSpeed 0.19 runs a bf16 pipeline on its BF16_Optimizer, and in
    which accumulation dtype (deepspeed/runtime/engine.py _do_optimizer_sanity_check).
    fp32: at ZeRO-1 with data_types.grad_accum_dtype fp32 ("model_dtype == bfloat16 and
    grad_accum_dtype == float32 and stage == 1 and not zero_cpu_offload"), which
    export/deepspeed.py writes exactly here: no reduce dtype asked (`default_reduce`), nothing
    offloaded. bf16: at ZeRO-0 always, where fp32 accumulation is an "unsupported mix".
    Elsewhere the ZeRO optimizer runs with 16-bit gradients. The cost model's rows and the
    exporter both read this one rule."""
    pipeline = np.asarray(pp) > 1
    zero = np.asarray(zero)
    fp32 = (pipeline & (zero == 1) & np.asarray(default_reduce, bool)
            & ~np.asarray(offload_optimizer, bool))
    return fp32, pipeline & (zero == 0)


@dataclass(frozen=True)
class Rows:
    """One value per candidate in every field (numpy arrays of the table's length)."""

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    sp: np.ndarray
    schedule: np.ndarray
    zero: np.ndarray
    offload_optimizer: np.ndarray
    offload_params: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    b: np.ndarray
    """Micro-batch size (sequences)."""
    gbs: np.ndarray
    layers_max: np.ndarray
    """Layers of the most loaded pipeline rank (all its chunks)."""
    layers_first: np.ndarray
    layers_last: np.ndarray
    world: np.ndarray
    m: np.ndarray
    """Micro-batches per step on one data-parallel rank."""
    shard: np.ndarray
    """Ranks the ZeRO states are sharded over: dp x cp (FSDP runs over both)."""
    vocab: np.ndarray
    """Vocabulary padded as the runtime pads it (params.padded_vocab)."""
    fsdp: np.ndarray
    """The autoplan runtime wraps the model in FSDP2 (else DDP or nothing)."""
    v_shape: np.ndarray
    """Zero-bubble's V schedule: the last stage sits on rank 0 beside the first."""
    unsharded_accumulation: np.ndarray
    """ZeRO-2/3 gradients accumulate unsharded until the last micro-batch (under a pipeline)."""
    sharded_grads: np.ndarray
    """Only the gradient shard is kept: ZeRO-2/3 without unsharded accumulation, and ZeRO-1 on
    FSDP2 with one micro-batch and no pipeline (zero1_syncs_every_unit)."""
    accumulate_bytes: np.ndarray
    """HBM bytes per parameter with which the optimizer adds each micro-batch's 16-bit
    gradients into a buffer of its own (DeepSpeed's BF16_Optimizer under a pipeline:
    RuntimeTraits.pipeline_engine_reduce; BF16_OPTIMIZER_ACCUMULATE_BYTES into fp32,
    BF16_ACCUMULATE_BYTES into bf16), else the runtime's RuntimeTraits.grad_accumulate_bytes
    (nanotron's fp32 accumulator); 0 where gradients accumulate in place."""
    weight_bytes: float
    act_scale: float
    """2 for fp32 activations, 1 for 16-bit."""
    ep: np.ndarray = field(default_factory=lambda: np.ones(1))
    """Expert-parallel degree (1 for dense models)."""
    etp: np.ndarray = field(default_factory=lambda: np.ones(1))
    """Expert tensor-parallel degree."""
    replicate: np.ndarray = field(default_factory=lambda: np.ones(1))
    """HSDP replicas of each ZeRO shard group (dp / dp_shard; 1 without HSDP)."""
    rc_modules: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    """Recompute.modules as a bit mask (plan_table.RC_MODULES; 0: the runtime's selective)."""
    rc_uniform: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=bool))
    """Recompute.method uniform: every layer recomputes, in groups of recompute_layers."""
    reduce_bytes: np.ndarray = field(default_factory=lambda: np.full(1, 4.0))
    """Bytes per gradient element in data-parallel reductions: Plan.grad_reduce_dtype, or
    the runtime's default for the precision (RuntimeTraits.reduce_bytes); set by rows_of."""
    grad_bytes: np.ndarray = field(default_factory=lambda: np.full(1, 4.0))
    """Bytes per element of the gradient buffer: the runtime's for the precision
    (RuntimeTraits.grad_bytes), or the reduce dtype's where the plan names one and the runtime
    keeps its buffer in it (RuntimeTraits.grads_in_reduce_dtype); set by rows_of."""

    @property
    def expert_shard(self) -> np.ndarray:
        """Ranks the routed experts' ZeRO states are sharded over: the expert data-parallel
        group, dp x cp x tp / (ep x etp) (Megatron-Core MoE parallel folding); under HSDP the
        shard group's dp_shard x cp in place of dp x cp (the replicas hold copies, as they do
        of the dense states)."""
        return self.shard * self.tp / (self.ep * self.etp)


def recomputed_layers(layers: np.ndarray, rows: Rows) -> np.ndarray:
    """Layers of a stage that recompute: all of them (also under the uniform method), or
    `recompute_layers` per chunk."""
    some = np.where((rows.recompute_layers < 0) | rows.rc_uniform, layers,
                    np.minimum(rows.recompute_layers * rows.vpp, layers))
    return np.where(rows.recompute == RC_NONE, 0, some).astype(float)


def uniform_groups(layers: np.ndarray, rows: Rows) -> np.ndarray:
    """Checkpointed groups of `recompute_layers` layers under the uniform method, per chunk
    (Megatron's _checkpointed_forward: the last group of a chunk may be shorter)."""
    k = np.maximum(rows.recompute_layers, 1)
    return rows.vpp * np.ceil(layers / rows.vpp / k)


def microbatches(gbs: np.ndarray, dp: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Micro-batches per step on each data-parallel rank (at least 1)."""
    return np.maximum(np.floor(np.asarray(gbs) / (np.asarray(dp) * np.asarray(b))), 1.0)


def zero1_syncs_every_unit(zero: np.ndarray, m: np.ndarray, pp: np.ndarray, fsdp: np.ndarray,
                           runtime: RuntimeTraits) -> np.ndarray:
    """Where ZeRO-1 reduce-scatters each unit's gradients in backward, as ZeRO-2 does, so only
    the shard stays: on FSDP2 (RuntimeTraits.fsdp2_copies) ZeRO-1 defers the gradient sync
    to the last micro-batch (autoplan's runtime/trainer.py _sync_context:
    set_requires_gradient_sync(last or zero >= 2), set_reshard_after_backward alike), and
    with one micro-batch and no pipeline that one is the last. Megatron's distributed
    optimizer keeps its whole gradient buffer whatever the count."""
    return ((np.asarray(zero) == 1) & (np.asarray(m) == 1) & (np.asarray(pp) == 1)
            & np.asarray(fsdp, bool) & runtime.fsdp2_copies)


def rows_of(table: Table, model: ModelSpec, precision: str, runtime: RuntimeTraits) -> Rows:
    dp, tp, pp, cp, vpp = (col(table, k).astype(float) for k in ("dp", "tp", "pp", "cp", "vpp"))
    zero = col(table, "zero_stage")
    off_o, off_p = col(table, "offload_optimizer"), col(table, "offload_params")
    b, gbs = col(table, "mbs").astype(float), col(table, "gbs").astype(float)
    l_max = col(table, "layers_max").astype(float)
    sched = col(table, "schedule")
    dp_shard = dp_col(table, "dp_shard").astype(float)  # 0: all of dp (no HSDP)
    shard_dp = np.where(dp_shard > 0, dp_shard, dp)
    shard = shard_dp * cp
    # grad_reduce codes (plan_table.REDUCE_DTYPES): 0 the runtime's default, 1 fp32, 2 bf16
    reduce_code = dp_col(table, "grad_reduce")
    reduce_bytes = np.array([runtime.reduce_bytes(precision), 4.0, 2.0])[reduce_code]
    grad_bytes = np.where((reduce_code != 0) & runtime.grads_in_reduce_dtype, reduce_bytes,
                          runtime.grad_bytes(precision))
    accumulate = np.zeros_like(pp) + runtime.grad_accumulate_bytes
    if runtime.pipeline_engine_reduce and precision == "bf16":
        # DeepSpeed 0.19 (engine._do_optimizer_sanity_check) runs a bf16 pipeline on
        # BF16_Optimizer: at ZeRO-1 with data_types.grad_accum_dtype fp32, which export writes
        # where no reduce dtype is asked and nothing is offloaded (export/deepspeed.py
        # bf16_optimizer), accumulating and reducing in fp32; at ZeRO-0 always, accumulating
        # in bf16 (fp32 there is an "unsupported mix") and partitioning its fp32 master and
        # Adam states over dp as ZeRO-1 does (bf16_optimizer.py fp32_groups_flat_partition)
        fp32, bf16 = bf16_optimizer_accumulation(pp, zero, reduce_code == 0, off_o)
        zero = np.where(bf16, 1, zero)
        reduce_bytes = np.where(fp32, 4.0, reduce_bytes)
        grad_bytes = np.where(fp32, BF16_OPTIMIZER_GRAD_BYTES,
                              np.where(bf16, 2.0 * runtime.grad_bytes(precision), grad_bytes))
        accumulate = np.where(fp32, BF16_OPTIMIZER_ACCUMULATE_BYTES,
                              np.where(bf16, BF16_ACCUMULATE_BYTES, accumulate))
    # DDP or FSDP2, as autoplan's runtime wraps the plan (plan_rules.data_parallel_wrappers)
    ep, etp = expert_col(table, "ep").astype(float), expert_col(table, "etp").astype(float)
    _, fsdp = data_parallel_wrappers(dp, tp, pp, cp, ep * etp, zero, precision == "fp32",
                                     off_o | off_p)
    deferred = runtime.pipeline_grad_sync is PipelineGradSync.LAST_MICROBATCH
    unsharded = (zero >= 2) & (pp > 1) & deferred
    m = microbatches(gbs, dp, b)
    return Rows(
        dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, sp=col(table, "sp").astype(bool), schedule=sched,
        zero=zero, offload_optimizer=off_o, offload_params=off_p,
        recompute=col(table, "recompute"), recompute_layers=col(table, "recompute_layers"),
        b=b, gbs=gbs, layers_max=l_max, layers_first=col(table, "layers_first").astype(float),
        layers_last=(col(table, "layers_last").astype(float) if "layers_last" in table
                     else l_max),
        world=dp * tp * pp * cp, m=m, shard=shard,
        vocab=params.padded_vocab(model, tp).astype(float), fsdp=fsdp,
        v_shape=(sched == ZERO_BUBBLE) & (vpp == 2) & (pp > 1),
        unsharded_accumulation=unsharded,
        sharded_grads=((zero >= 2) & ~unsharded) | zero1_syncs_every_unit(
            zero, m, pp, fsdp, runtime),
        accumulate_bytes=accumulate,
        weight_bytes=4.0 if precision == "fp32" else 2.0,
        act_scale=2.0 if precision == "fp32" else 1.0,
        ep=ep, etp=etp,
        replicate=dp / shard_dp, reduce_bytes=reduce_bytes, grad_bytes=grad_bytes,
        rc_modules=dp_col(table, "rc_modules"),
        rc_uniform=dp_col(table, "rc_method") == RC_UNIFORM,
    )
