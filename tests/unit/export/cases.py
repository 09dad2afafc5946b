"""Named plans the export tests share: which targets must express each, and which must refuse."""

from __future__ import annotations

from autoplan.export.base import ExportOptions
from autoplan.plan import (
    Attention,
    Batch,
    ClusterRef,
    Offload,
    Parallel,
    Pipeline,
    Plan,
    Precision,
    Recompute,
    RecomputePolicy,
    ReduceDtype,
    Schedule,
)

ALL = ("slurm", "kubernetes", "torchrun", "deepspeed", "megatron", "torchtitan")
LAUNCHERS = ("slurm", "kubernetes", "torchrun")


def plan(model: str = "gpt3-1.3b", gpus: int = 16, **kw) -> Plan:
    kw.setdefault("parallel", Parallel(dp=gpus))
    kw.setdefault("batch", Batch(micro_batch_size=1, global_batch_size=8 * gpus))
    return Plan(model=model, cluster=ClusterRef("h100-sxm-80gb", gpus), **kw)


FULL = Recompute(RecomputePolicy.FULL)
SELECTIVE = Recompute(RecomputePolicy.SELECTIVE)
INTERLEAVED = Pipeline(Schedule.INTERLEAVED_1F1B, vpp=2)

CASES: dict[str, tuple[Plan, tuple[str, ...]]] = {
    # name: (plan, targets that must express it; every other target must refuse it)
    "dp-zero1": (plan(zero_stage=1), ALL[:5]),
    "dp-zero3-offload": (
        plan(zero_stage=3, offload=Offload(optimizer=True, params=True), recompute=FULL),
        (*LAUNCHERS, "deepspeed"),
    ),
    "megatron-3d": (
        plan(
            "gpt3-13b",
            64,
            parallel=Parallel(dp=2, tp=8, pp=4),
            sequence_parallel=True,
            zero_stage=1,
            pipeline=INTERLEAVED,
            recompute=SELECTIVE,
            batch=Batch(1, 128),
        ),
        (*LAUNCHERS, "megatron"),
    ),
    "llama-uneven-pp": (
        plan(
            "llama-3.1-8b",
            16,
            parallel=Parallel(dp=2, tp=2, pp=4),
            sequence_parallel=True,
            zero_stage=3,
            pipeline=Pipeline(Schedule.ONE_F_ONE_B, 1, (7, 9, 9, 7)),
            recompute=FULL,
            batch=Batch(2, 64),
        ),
        (*LAUNCHERS, "torchtitan"),
    ),
    "llama-cp-zb": (
        plan(
            "llama-3.1-8b",
            32,
            parallel=Parallel(dp=2, tp=4, pp=2, cp=2),
            sequence_parallel=True,
            zero_stage=2,
            pipeline=Pipeline(Schedule.ZERO_BUBBLE, vpp=2),
            batch=Batch(1, 32),
        ),
        (*LAUNCHERS, "torchtitan"),
    ),
    "llama-megatron-fullblock": (
        plan(
            "llama-2-70b",
            64,
            parallel=Parallel(dp=2, tp=8, pp=4),
            sequence_parallel=True,
            zero_stage=1,
            offload=Offload(optimizer=True),
            pipeline=INTERLEAVED,
            recompute=Recompute(RecomputePolicy.FULL, 2),
            batch=Batch(1, 64),
            attention=Attention.EAGER,
        ),
        (*LAUNCHERS, "megatron"),
    ),
    "llama-uneven-vpp": (
        plan(
            "llama-3.1-8b",
            16,
            parallel=Parallel(dp=2, tp=2, pp=4),
            sequence_parallel=True,
            zero_stage=1,
            pipeline=Pipeline(Schedule.INTERLEAVED_1F1B, 2, (3, 4, 4, 5, 5, 4, 4, 3)),
            batch=Batch(1, 32),
        ),
        (*LAUNCHERS, "megatron"),
    ),
    "fp16-pipeline-ds": (
        plan(
            "gpt3-2.7b",
            16,
            parallel=Parallel(dp=4, pp=4),
            zero_stage=1,
            recompute=FULL,
            precision=Precision.FP16,
            batch=Batch(2, 64),
        ),
        (*LAUNCHERS, "deepspeed", "megatron"),
    ),
    # fp32 flash attention: Transformer Engine's fused attention takes 16-bit inputs only, so
    # Megatron refuses it (megatron_te.te_reasons); torchtitan replicates (ZeRO-0, DDP) only as
    # the sole parallelism ("DDP has not supported > 1D parallelism"), so it refuses dp x tp
    "single-node-tp": (
        plan(
            "llama-3.1-8b",
            4,
            parallel=Parallel(dp=2, tp=2),
            zero_stage=0,
            precision=Precision.FP32,
            batch=Batch(4, 64),
        ),
        (*LAUNCHERS, "deepspeed"),
    ),
    "single-node-tp-fsdp": (
        plan(
            "llama-3.1-8b",
            4,
            parallel=Parallel(dp=2, tp=2),
            sequence_parallel=True,
            zero_stage=2,
            precision=Precision.FP32,
            batch=Batch(4, 64),
        ),
        (*LAUNCHERS, "deepspeed", "torchtitan"),
    ),
    # Llama 2 13B has torchtitan's Llama 3 architecture but no registered flavor: the Python
    # config defines one at its shape (the TOML form refuses)
    "llama2-13b-fsdp": (plan("llama-2-13b", 64, zero_stage=3, recompute=FULL,
                             batch=Batch(2, 512)), ALL),
    # the plan rules refuse it for every target (`autoplan train` would too)
    "sp-without-tp": (plan(sequence_parallel=True), ()),
    "nodes-not-whole": (plan(gpus=12, batch=Batch(1, 12)), ()),
    # HSDP (parallel.dp_shard) and the gradient reduce dtype: torchtitan's replicate/shard
    # degrees for ZeRO-2/3, Megatron's optimizer instances for ZeRO-1; torchtitan reduces in
    # float32 only, DeepSpeed has no HSDP
    "hsdp-zero3-reduce-fp32": (
        plan("llama-3.1-8b", parallel=Parallel(dp=16, dp_shard=8), zero_stage=3,
             grad_reduce_dtype=ReduceDtype.FP32),
        (*LAUNCHERS, "torchtitan"),
    ),
    "hsdp-zero1-reduce-bf16": (
        plan("llama-3.1-8b", parallel=Parallel(dp=16, dp_shard=8), zero_stage=1,
             grad_reduce_dtype=ReduceDtype.BF16),
        (*LAUNCHERS, "megatron"),
    ),
    "zero3-reduce-bf16": (plan(zero_stage=3, grad_reduce_dtype=ReduceDtype.BF16),
                          (*LAUNCHERS, "deepspeed", "megatron")),  # Megatron-FSDP, pp 1
}


def options(target: str, **kw) -> ExportOptions:
    kw.setdefault("gpus_per_node", 8)
    return ExportOptions(**kw)


# DeepSpeed's 3D parallelism (Megatron-DeepSpeed): the GPT-3 175B plan of issue #15
CASES["gpt3-175b-3d-sp"] = (
    plan(
        "gpt3-175b",
        1024,
        parallel=Parallel(dp=16, tp=8, pp=8),
        sequence_parallel=True,
        zero_stage=1,
        recompute=SELECTIVE,
        batch=Batch(2, 1536),
    ),
    (*LAUNCHERS, "deepspeed", "megatron"),
)
