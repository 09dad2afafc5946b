"""The plan: how one training job is split over GPUs (DESIGN.md section 4), and its strict
loader from a mapping (plan_from_dict).

A Plan is what `search` writes and `train`/`export` read. Its validity rules live in
`autoplan.plan_rules` so one plan and a table of a million candidates are judged by the same code;
plan files (saving, loading, the paths they name) in `autoplan.plan_files`, `--set` edits in
`autoplan.plan_sets`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec, load_model
from autoplan.yaml_io import check_schema_version, from_dict, show, unknown_key_fix


class Schedule(str, enum.Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE = "zero-bubble"


class RecomputePolicy(str, enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeMethod(str, enum.Enum):
    """How `recompute.num_layers` counts for full recompute (Megatron-LM --recompute-method)."""

    BLOCK = "block"
    """The first num_layers layers of each stage (model chunk) are recomputed, one checkpoint
    per layer; the rest keep everything."""
    UNIFORM = "uniform"
    """Every layer is recomputed, in checkpointed groups of num_layers consecutive layers: only
    each group's input is kept (megatron/core/transformer/transformer_block.py,
    _checkpointed_forward)."""


class RecomputeModule(str, enum.Enum):
    """Submodules selective recompute checkpoints; Megatron-Core's --recompute-modules names
    (TransformerConfig.recompute_modules in megatron/core/transformer/
    transformer_config.py, NVIDIA/Megatron-LM at d2c5e8b4f4fa0062d8cd9cbe18a7fca7cf1f99a3)."""

    CORE_ATTN = "core_attn"
    """The attention core softmax(QK^T)V (normal checkpointing): keeps Q, K, V, re-runs the
    core; frees its softmax/dropout tensors (eager) or row statistics and output (fused)."""
    MLP = "mlp"
    """The dense MLP (normal checkpointing): keeps its input, re-runs its GEMMs and
    activation; frees the first GEMM's output and the activation's."""
    LAYERNORM = "layernorm"
    """input_layernorm and pre_mlp_layernorm (output-discarding checkpointing): keeps each
    norm's input, frees its output (the next GEMM's saved input) and re-runs the norm."""
    MOE_ACT = "moe_act"
    """The routed experts' activation function (output-discarding checkpointing,
    megatron/core/transformer/moe/experts.py: CheckpointWithoutOutput around the activation,
    discard_output_and_register_recompute after fc2): keeps fc1's output, frees the
    activation's output (fc2's saved input) and re-runs the activation. MoE models only."""
    MOE = "moe"
    """The whole MoE layer (normal checkpointing, megatron/core/transformer/moe/moe_layer.py:
    MoELayer.forward runs router, dispatch, experts and combine under tensor_parallel.checkpoint
    when "moe" is in recompute_modules): keeps the layer's input, frees everything the router,
    the token dispatch and the experts keep, and re-runs them, all-to-alls included, in
    backward. MoE models only; it re-runs the experts' activation too, so it goes without
    moe_act."""


class Attention(str, enum.Enum):
    FLASH = "flash"
    EAGER = "eager"


class Precision(str, enum.Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"
    """FP8 GEMMs (E4M3 forward, E5M2 gradients) with bf16 weights, attention and the rest, as
    Transformer Engine and torchao's float8 training run it; needs a device with an fp8 peak."""


class ReduceDtype(str, enum.Enum):
    """The dtype data-parallel gradient reductions run in (Plan.grad_reduce_dtype)."""

    FP32 = "fp32"
    BF16 = "bf16"
    """Half the bytes on the wire; needs a bf16 or fp8 plan (bf16 gradients to reduce)."""


MAX_INT = 2**40
"""Largest count any field takes (degrees, batch sizes, GPUs); keeps numpy int64 safe."""


def _check_int(field_name: str, value: int, low: int, high: int | None = None) -> None:
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ConfigError(field_name, f"got {show(value)}", f"expected an integer {bound}")
    if value > MAX_INT:
        raise ConfigError(field_name, f"got {show(value)}", f"expected an integer up to {MAX_INT}")


@dataclass(frozen=True)
class ClusterRef:
    profile: str
    """Hardware profile: a name in profiles/ or a path to a profile YAML."""
    num_gpus: int
    """GPUs the job runs on; must equal dp * tp * pp * cp."""

    def __post_init__(self) -> None:
        _check_int("cluster.num_gpus", self.num_gpus, 1)


@dataclass(frozen=True)
class Parallel:
    dp: int = 1
    """Data-parallel replicas (ZeRO shards over this group)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron-style column/row split of each block)."""
    pp: int = 1
    """Pipeline stages."""
    cp: int = 1
    """Context-parallel degree (sequence split for attention)."""
    ep: int = 1
    """Expert-parallel degree: each MoE block's routed experts are split over ep ranks. It
    folds into dp x cp x tp as in Megatron-Core's MoE parallel folding (parallel_state
    .initialize_model_parallel: per pipeline stage, tp x cp x dp = etp x ep x expert-dp), so
    world_size stays dp * tp * pp * cp; ep * etp must divide dp * cp * tp."""
    etp: int = 1
    """Expert tensor-parallel degree: each routed expert's MLP split over etp ranks."""
    dp_shard: int | None = None
    """HSDP: ZeRO/FSDP shards over groups of dp_shard of the dp ranks and replicates over
    dp / dp_shard such groups (torchtitan's data_parallel_shard_degree); must divide dp and
    needs zero_stage >= 1. null: shard over all of dp (no replication)."""

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "etp"):
            _check_int(f"parallel.{name}", getattr(self, name), 1)
        if self.dp_shard is not None:
            _check_int("parallel.dp_shard", self.dp_shard, 1)

    @property
    def shard_degree(self) -> int:
        """dp ranks one ZeRO shard group spans (dp unless HSDP)."""
        return self.dp if self.dp_shard is None else self.dp_shard

    @property
    def replicate_degree(self) -> int:
        """HSDP replicas of each shard group (1 unless HSDP); exact only for a valid plan."""
        return max(1, self.dp // self.shard_degree)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(frozen=True)
class Pipeline:
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """gpipe | 1f1b | interleaved-1f1b | zero-bubble."""
    vpp: int = 1
    """Virtual stages (model chunks) per pipeline rank; > 1 needs interleaved-1f1b."""
    layers_per_stage: tuple[int, ...] | None = None
    """Optional uneven split: layers of each of the pp * vpp stages, in order. Default: even.
    The first and the last entry may be 0: an embedding-only first stage and a stage of only
    the final norm, output layer and loss (Megatron-Core's layout "E|t*n|...|t*n|L")."""

    def __post_init__(self) -> None:
        _check_int("pipeline.vpp", self.vpp, 1)
        if self.layers_per_stage is not None:
            last = len(self.layers_per_stage) - 1
            for i, n in enumerate(self.layers_per_stage):
                if n == 0 and 0 < i < last:
                    raise ConfigError(f"pipeline.layers_per_stage[{i}]", "got 0 on a middle "
                                      "stage", "only the first and the last stage may hold no "
                                      "layers (embedding-only, loss-only); give it at least 1")
                _check_int(f"pipeline.layers_per_stage[{i}]", n, 0 if i in (0, last) else 1)


@dataclass(frozen=True)
class Offload:
    optimizer: bool = False
    """Optimizer states (and the fp32 master weights) live in host memory; the step runs on CPU."""
    params: bool = False
    """Parameters live in host memory and stream to the GPU per layer (needs ZeRO-3)."""


@dataclass(frozen=True)
class Recompute:
    policy: RecomputePolicy = RecomputePolicy.NONE
    """none | selective (`modules`, or the runtime's own kind: cost/runtime_kinds.SelectiveKind) |
    full (whole blocks)."""
    num_layers: int | None = None
    """block method: recomputed layers of each pipeline stage (each model chunk when vpp > 1),
    counted from its first layer; null means all. uniform method: layers per checkpointed
    group (required)."""
    method: RecomputeMethod = RecomputeMethod.BLOCK
    """block | uniform (Megatron --recompute-method); uniform needs policy full."""
    modules: tuple[RecomputeModule, ...] | None = None
    """Selective recompute by submodule (Megatron-Core --recompute-modules): some of core_attn,
    mlp, layernorm, moe_act, moe; needs policy selective. null: the runtime's own selective
    recompute. As in Megatron-Core, mlp checkpoints dense MLPs only (not a MoE block's)."""

    def label(self) -> str:
        """As `estimate` and `search` show it: the policy, selective(layernorm+moe) for a module
        set, full-uniform:N for the uniform method's groups of N."""
        if self.modules:
            return f"{self.policy.value}({'+'.join(m.value for m in self.modules)})"
        if self.method == RecomputeMethod.UNIFORM:
            return f"{self.policy.value}-uniform:{self.num_layers}"
        return self.policy.value

    def __post_init__(self) -> None:
        if self.num_layers is not None:
            _check_int("recompute.num_layers", self.num_layers, 0)
        if self.modules is not None:
            if self.policy != RecomputePolicy.SELECTIVE:
                raise ConfigError("recompute.modules", f"got {[m.value for m in self.modules]} "
                                  f"with policy {self.policy.value}",
                                  "set policy: selective, or remove modules")
            if not self.modules or len(set(self.modules)) != len(self.modules):
                raise ConfigError("recompute.modules", f"got {[m.value for m in self.modules]}",
                                  "list each of core_attn, mlp, layernorm, moe_act, moe at most "
                                  "once, "
                                  "or null")
        if self.method == RecomputeMethod.UNIFORM:
            if self.policy != RecomputePolicy.FULL:
                raise ConfigError("recompute.method", f"got uniform with policy "
                                  f"{self.policy.value}", "uniform needs policy: full")
            if not self.num_layers:
                raise ConfigError("recompute.num_layers", f"got {show(self.num_layers)} with "
                                  "method uniform", "set the layers per group, at least 1")

    @property
    def module_set(self) -> frozenset[RecomputeModule]:
        """The chosen modules, empty when none are named."""
        return frozenset(self.modules or ())


@dataclass(frozen=True)
class Batch:
    micro_batch_size: int
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int
    """Sequences per optimizer step over all replicas."""

    def __post_init__(self) -> None:
        _check_int("batch.micro_batch_size", self.micro_batch_size, 1)
        _check_int("batch.global_batch_size", self.global_batch_size, 1)


@dataclass(frozen=True)
class Plan:
    model: str | ModelSpec
    """A preset name, a path to a model YAML / config.json, or an inline model spec."""
    cluster: ClusterRef
    batch: Batch
    parallel: Parallel = field(default_factory=Parallel)
    sequence_parallel: bool = False
    """Megatron sequence parallelism: shard norms/dropout activations over tp (needs tp > 1)."""
    pipeline: Pipeline = field(default_factory=Pipeline)
    zero_stage: int = 0
    """0: replicated states; 1: optimizer sharded; 2: + gradients; 3: + parameters."""
    offload: Offload = field(default_factory=Offload)
    recompute: Recompute = field(default_factory=Recompute)
    precision: Precision = Precision.BF16
    """bf16 | fp16 mixed precision with fp32 master weights, or plain fp32."""
    attention: Attention = Attention.FLASH
    """flash: fused attention that keeps no s x s matrices (SDPA / FlashAttention); eager: the
    unfused softmax(QK^T)V that stores them (Megatron-LM before FlashAttention)."""
    grad_reduce_dtype: ReduceDtype | None = None
    """fp32 | bf16: the dtype of data-parallel gradient reductions (FSDP2's
    MixedPrecisionPolicy.reduce_dtype, Megatron's --grad-reduce-in-bf16, DeepSpeed's
    communication_data_type); null: the runtime's default (cost.runtime_traits reduce_bytes_*)."""
    predicted: dict[str, Any] | None = None
    """Written by search/estimate for comparison; train ignores it except to report."""

    def __post_init__(self) -> None:
        _check_int("zero_stage", self.zero_stage, 0, 3)

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (exact only for a valid plan)."""
        per_replica = self.batch.global_batch_size // self.parallel.dp
        return max(1, per_replica // self.batch.micro_batch_size)

    def model_spec(self) -> ModelSpec:
        return load_model(self.model, "model")

    def replace(self, **changes: Any) -> Plan:
        return dataclasses.replace(self, **changes)


PLAN_KEYS: tuple[str, ...] = (*(f.name for f in dataclasses.fields(Plan)), "schema_version")
"""The keys a plan file may hold at its top: the Plan's fields and its schema_version. One
list for the loader (plan_from_dict) and for estimate's --plan, which checks a file's keys
before it adds the flags' fields (plan_args)."""


def check_plan_keys(data: dict[Any, Any]) -> None:
    """Refuse (exit 2) a top-level key that is no plan field, listing PLAN_KEYS."""
    for key in data:
        if key not in PLAN_KEYS:
            raise ConfigError(_key_shown(key), "unknown key", unknown_key_fix(key, PLAN_KEYS))


def check_section_keys(data: dict[Any, Any], cls: type, section: str) -> None:
    """Refuse (exit 2) a key of plan section `section` that is no field of `cls`, as the loader
    does, for callers that name a missing field before the loader runs: a misspelt
    `cluster: {profle: ...}` is an unknown key, not a missing profile."""
    known = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in known:
            raise ConfigError(f"{section}.{_key_shown(key)}", "unknown key",
                              unknown_key_fix(key, known))


def _key_shown(key: Any) -> str:
    """A key as an error names it: as written when it is short printable text (yaml_io's
    from_dict shows keys so too)."""
    return str(key if isinstance(key, str) and key.isprintable() and key.strip()
               and len(key) <= 100 else show(key, 100))


def plan_from_dict(data: Any, where: str = "plan") -> Plan:
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {show(data)}", "expected a mapping of plan fields")
    check_plan_keys(data)
    data = check_schema_version(data, "")
    model = data.get("model")
    if isinstance(model, dict):
        data["model"] = load_model(model)
    elif "model" in data and not isinstance(model, str | ModelSpec):
        raise ConfigError("model", f"got {show(model)}",
                          "expected a preset name or a mapping of model fields")
    return from_dict(Plan, data, "")
