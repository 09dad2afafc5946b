"""Search spaces: the allowed values of every plan knob (search_spaces/NAME.yaml, DESIGN.md s7).

Loaded strictly like plans: unknown keys list the valid ones, schema_version is checked, and each
bad value is a one-line ConfigError naming the field, the value and the fix. Finding space files
and their `auto` spellings are autoplan.space_files'; enumerating or sampling the space is left to
`autoplan.search`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.plan import (
    Attention,
    Precision,
    Recompute,
    RecomputeMethod,
    RecomputeModule,
    RecomputePolicy,
    ReduceDtype,
    Schedule,
)
from autoplan.space_files import (
    AUTO,
    AUTO_KNOBS,
    SPACES_DIR,
    available_spaces,
    listify,
    read_auto,
    space_label,
    space_path,
)
from autoplan.yaml_io import check_schema_version, from_dict, read_yaml

log = logging.getLogger(__name__)

ENUMERABLE_LIMIT = 5_000_000
"""Default ceiling on candidates for the exhaustive sampler; larger spaces go to Optuna."""
AUTO_VPP_ALL = 8
"""`vpp: auto` tries every vpp up to this one at each pp, with uneven splits where pp * vpp
does not divide the layers (NVIDIA's Llama 3.x recipes use VP 5-8); deeper ones only where a
virtual stage gets a whole number of blocks (autoplan.search.derived.auto_vpp)."""


class Split(str, enum.Enum):
    """How layers are assigned to pipeline stages."""

    EVEN = "even"
    BALANCED = "balanced"
    """Fewer blocks on the stages that also hold the embedding or the output layer, balancing
    their time over the model's layer graph (autoplan.search.partition)."""
    ENDS = "ends"
    """The first and the last stage one block lighter than the others, for the embedding and
    the loss (Megatron-Core's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split; Llama 3 405B's 126 layers on 16 stages: 7, 8 x 14, 7)."""
    EMBED_LOSS = "embed-loss"
    """An embedding-only first stage and a last stage of only the final norm, output layer and
    loss, the blocks even over the stages between (Megatron-Core's layout "E|t*n|...|t*n|L";
    runtimes without it: cost/runtime_traits.RuntimeTraits.layer_splits)."""
    DEEPSPEED = "deepspeed"
    """The split DeepSpeed's PipelineModule makes of Megatron-DeepSpeed's GPTModelPipe
    (partition_method type:transformer, one stage per rank): the only uneven one it runs."""


def _check_values(name: str, values: tuple[Any, ...], *, low: int | None = None,
                  high: int | None = None, example: str = "") -> None:
    if not values:
        raise ConfigError(name, "got an empty list", f"list at least one value{example}")
    if len(set(values)) != len(values):
        shown = [getattr(v, "value", v) for v in values]  # an enum as the file spells it
        raise ConfigError(name, f"got {shown} with repeats", "list each value once")
    for v in values:
        if v is None or low is None:
            continue
        if v < low or (high is not None and v > high):
            bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise ConfigError(name, f"got {v!r} in {list(values)}",
                              f"use integers {bound}{example}")


def _enum_values(values: tuple[Any, ...]) -> list[Any]:
    return [v.value if isinstance(v, enum.Enum) else v for v in values]


@dataclass(frozen=True)
class ParallelSpace:
    dp: tuple[int, ...] | None = None
    """Allowed data-parallel degrees; null: whatever the GPU count leaves (num_gpus/(tp*pp*cp))."""
    tp: tuple[int, ...] = (1,)
    """Tensor-parallel degrees."""
    pp: tuple[int, ...] = (1,)
    """Pipeline-parallel degrees."""
    cp: tuple[int, ...] = (1,)
    """Context-parallel degrees."""
    ep: tuple[int, ...] | None = None
    """Expert-parallel degrees (MoE models; folded into dp x cp x tp as Megatron-Core does);
    null: [1] for a dense model, for a MoE model 1, 2, 4, ..., 64 where they divide the experts
    (autoplan.search.derived.expert_pairs)."""
    etp: tuple[int, ...] | None = (1,)
    """Expert tensor-parallel degrees (each routed expert split over etp ranks); null (`auto`
    in YAML): 1 and the layout's tp for a MoE model, Megatron-Core's two common settings
    (ETP 1, or ETP = TP), and 1 for a dense model (autoplan.search.derived.expert_pairs)."""
    dp_shard: tuple[int | None, ...] = (None,)
    """HSDP shard group sizes (Plan.parallel.dp_shard): null shards over all of dp; a size
    that does not divide a layout's dp (or is not below it), or comes with ZeRO-0, is refused
    by the rules. [null, 8] also tries one 8-GPU node per shard group, replicated across."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp"):
            _check_values(name, getattr(self, name), low=1, example=", e.g. [1, 2, 4, 8]")
        if self.etp is not None:
            _check_values("etp", self.etp, low=1, example=", e.g. [1, 2], or auto (1 and tp)")
        _check_values("dp_shard", self.dp_shard, low=1, example=", or null (all of dp)")
        if self.ep is not None:
            _check_values("ep", self.ep, low=1, example=", or null (from the model)")
        if self.dp is not None:
            _check_values("dp", self.dp, low=1, example=", or null for any")


@dataclass(frozen=True)
class PipelineSpace:
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B,)
    """Pipeline schedules (only matter when pp > 1)."""
    vpp: tuple[int, ...] | None = (1,)
    """Virtual stages per rank (> 1 needs interleaved-1f1b or zero-bubble); null (`auto` in
    YAML): every vpp the layers allow at each pp (autoplan.search.derived.auto_vpp)."""
    split: tuple[Split, ...] = (Split.EVEN,)
    """even | balanced | ends | embed-loss | deepspeed layer-to-stage splits; every sampler
    scores each one that differs from the even split (autoplan.search.partition)."""

    def __post_init__(self) -> None:
        _check_values("schedule", self.schedule)
        if self.vpp is not None:
            _check_values("vpp", self.vpp, low=1, example=", e.g. [1, 2, 4], or auto")
        _check_values("split", self.split)

    def listed_vpp(self) -> tuple[int, ...]:
        """The vpp list without a model: `auto` counts as 1..AUTO_VPP_ALL (the model's deeper
        even interleavings add rows; autoplan.search.space.joint_rows counts them)."""
        return self.vpp if self.vpp is not None else tuple(range(1, AUTO_VPP_ALL + 1))


@dataclass(frozen=True)
class OffloadSpace:
    optimizer: tuple[bool, ...] = (False,)
    """Optimizer states in host memory (needs ZeRO >= 1)."""
    params: tuple[bool, ...] = (False,)
    """Parameters in host memory (needs ZeRO-3)."""

    def __post_init__(self) -> None:
        _check_values("optimizer", self.optimizer)
        _check_values("params", self.params)


@dataclass(frozen=True)
class RecomputeSpace:
    policy: tuple[RecomputePolicy, ...] = (RecomputePolicy.NONE,)
    """Activation recompute policies."""
    num_layers: tuple[int | None, ...] = (None,)
    """Recomputed layers per stage for policies other than none; null means all."""
    modules: tuple[tuple[RecomputeModule, ...] | None, ...] = (None,)
    """Module sets selective recompute tries (Plan recompute.modules, Megatron-Core's
    --recompute-modules), e.g. [null, [core_attn, layernorm]]; null: the runtime's own."""
    method: tuple[RecomputeMethod, ...] = (RecomputeMethod.BLOCK,)
    """Methods full recompute tries with each num_layers: block (the first n of each stage)
    and uniform (every layer, in groups of n; null n is skipped)."""

    def __post_init__(self) -> None:
        _check_values("policy", self.policy)
        _check_values("num_layers", self.num_layers, low=1,
                      example=" or null (all layers), e.g. [null, 1, 2, 4]")
        _check_values("modules", self.modules)
        _check_values("method", self.method)
        for ms in self.modules:
            if ms is not None:  # the plan's own checks: non-empty, no repeats
                Recompute(policy=RecomputePolicy.SELECTIVE, modules=ms)
        if RecomputePolicy.FULL in self.policy and RecomputeMethod.BLOCK not in self.method \
                and all(n is None for n in self.num_layers):
            # uniform recompute checkpoints groups of num_layers layers: null is no group size
            raise ConfigError("method", "policy full with method [uniform] needs a group size, "
                              "but num_layers is [null], so full recompute has no choice",
                              "add a layer count to num_layers (e.g. [null, 1, 2]) or block "
                              "to method")


def device_precision(peak_flops_per_s: Mapping[str, float], cpu: bool) -> str:
    """The 16-bit (or 32-bit) format a device trains in unless told otherwise, for the search's
    `precision: auto` and estimate's default plan alike: bf16 where it has a bf16 peak (A100
    and later), else fp16 (V100), else fp32; on a CPU fp32 first, whose bf16 matmuls run
    several times slower than fp32 at most sizes (profiles/cpu-gloo.yaml)."""
    order = ("fp32", "bf16", "fp16") if cpu else ("bf16", "fp16", "fp32")
    return next((p for p in order if p in peak_flops_per_s), "fp32")


@dataclass(frozen=True)
class SearchSpace:
    name: str
    """Identifier shown in summaries."""
    description: str = ""
    """What the space is for."""
    parallel: ParallelSpace = field(default_factory=ParallelSpace)
    sequence_parallel: tuple[bool, ...] = (False,)
    """Megatron sequence parallelism on/off (needs tp > 1)."""
    pipeline: PipelineSpace = field(default_factory=PipelineSpace)
    zero_stage: tuple[int, ...] = (0,)
    """ZeRO stages 0..3."""
    offload: OffloadSpace = field(default_factory=OffloadSpace)
    recompute: RecomputeSpace = field(default_factory=RecomputeSpace)
    micro_batch_size: tuple[int, ...] = (1,)
    """Sequences per micro-batch."""
    precision: tuple[Precision, ...] = ()
    """Training precisions (bf16 | fp16 | fp32 | fp8); empty (`auto` in YAML): the device's own
    16-bit format, bf16 where it has one, else fp16 (V100), fp32 on CPU (`for_device`)."""
    attention: tuple[Attention, ...] = ()
    """Attention kernels (flash | eager); empty (`auto` in YAML): flash where the runtime runs
    a fused kernel on the device, else eager (`for_runtime`)."""
    grad_reduce_dtype: tuple[ReduceDtype | None, ...] = (None,)
    """Gradient reduce dtypes (Plan.grad_reduce_dtype): null is the runtime's default, fp32,
    bf16 (bf16/fp8 plans only; others count as precision-unsupported)."""
    max_enumerate: int = ENUMERABLE_LIMIT
    """Largest candidate count the default sampler enumerates; above it, TPE."""
    min_tokens_per_cp_rank: int = 0
    """cp > 1 only where seq_len / cp keeps at least this many tokens per rank (the default
    space: 1024, so a 2K sequence tries cp 2 and the Llama 3 paper's 128K context cp 16 and
    above); 0 tries every listed cp."""

    def __post_init__(self) -> None:
        _check_values("sequence_parallel", self.sequence_parallel)
        _check_values("zero_stage", self.zero_stage, low=0, high=3)
        _check_values("micro_batch_size", self.micro_batch_size, low=1,
                      example=", e.g. [1, 2, 4]")
        if self.precision:  # empty: auto, settled per device by for_device
            _check_values("precision", self.precision)
        if self.attention:  # empty: auto, settled per runtime and device by for_runtime
            _check_values("attention", self.attention)
        _check_values("grad_reduce_dtype", self.grad_reduce_dtype)
        if self.min_tokens_per_cp_rank < 0:
            raise ConfigError("min_tokens_per_cp_rank", f"got {self.min_tokens_per_cp_rank}",
                              "expected 0 (every cp) or a positive token count")
        if self.max_enumerate < 1:
            raise ConfigError("max_enumerate", f"got {self.max_enumerate}",
                              "expected a positive integer")

    def knob_sizes(self) -> dict[str, int]:
        """Number of values of each independently enumerated knob (dp is derived)."""
        from autoplan.search.space import recompute_pairs

        rc_pairs = len(recompute_pairs(self))
        return {
            "tp": len(self.parallel.tp), "pp": len(self.parallel.pp), "cp": len(self.parallel.cp),
            "sp": len(self.sequence_parallel), "schedule": len(self.pipeline.schedule),
            "vpp": len(self.pipeline.listed_vpp()), "zero_stage": len(self.zero_stage),
            "offload_optimizer": len(self.offload.optimizer),
            "offload_params": len(self.offload.params), "recompute": rc_pairs,
            "mbs": len(self.micro_batch_size), "precision": max(len(self.precision), 1),
            "attention": max(len(self.attention), 1), "dp_shard": len(self.parallel.dp_shard),
            "grad_reduce_dtype": len(self.grad_reduce_dtype),
        }

    def size(self, num_gpu_counts: int = 1) -> int:
        """Candidates the exhaustive sampler generates (before any rule, world-size misfits
        included) for that many GPU counts with even splits; the shapes the rules always refuse
        are not listed (autoplan.search.space: vpp without interleaving, sp at tp 1, offload
        without ZeRO). The model's uneven splits add rows (space.joint_rows counts them)."""
        from autoplan.plan_table import SCHEDULES
        from autoplan.search.space import memory_triples, recompute_pairs, shape_allowed, sp_values

        shapes = sum(shape_allowed(pp, SCHEDULES.index(Schedule(s)), v)
                     for pp in self.parallel.pp for s in self.pipeline.schedule
                     for v in self.pipeline.listed_vpp())
        sps = sum(len(sp_values(self, tp)) for tp in self.parallel.tp)
        rest = len(memory_triples(self)) * len(recompute_pairs(self)) \
            * len(self.micro_batch_size) * max(len(self.precision), 1) * max(len(self.attention), 1) \
            * len(self.parallel.dp_shard) * len(self.grad_reduce_dtype)
        return shapes * sps * len(self.parallel.cp) * rest * num_gpu_counts

    def cp_for(self, seq_len: int) -> tuple[int, ...]:
        """The listed cp degrees this sequence length supports under min_tokens_per_cp_rank
        (the smallest listed always stays)."""
        keep = tuple(c for c in self.parallel.cp
                     if c == min(self.parallel.cp) or seq_len // c >= self.min_tokens_per_cp_rank)
        return keep

    def for_model(self, seq_len: int) -> SearchSpace:
        """The space with its cp list cut to what `seq_len` supports (cp_for)."""
        cps = self.cp_for(seq_len)
        if cps == self.parallel.cp:
            return self
        return dataclasses.replace(self, parallel=dataclasses.replace(self.parallel, cp=cps))

    def for_device(self, peak_flops_per_s: Mapping[str, float], cpu: bool) -> SearchSpace:
        """The space with `precision: auto` settled for a device: bf16 where it has a bf16
        peak (A100 and later), else fp16 (V100, no bf16 tensor cores), fp32 on a CPU (whose
        bf16 matmuls run several times slower than fp32, profiles/cpu-gloo.yaml); and fp8
        beside bf16 where the device has fp8 tensor cores (H100, H200, H800: issue #12, NVIDIA's
        own runs gain 1.35-1.6x with FP8 and their best layouts change), the attention core and
        output layer staying 16-bit as the cost model prices them."""
        if self.precision:
            return self
        pick = device_precision(peak_flops_per_s, cpu)
        fp8 = () if cpu or pick != "bf16" or "fp8" not in peak_flops_per_s else (Precision.FP8,)
        return dataclasses.replace(self, precision=(Precision(pick), *fp8))

    def for_runtime(self, fused: list[bool]) -> SearchSpace:
        """The space with `attention: auto` settled: flash where the runtime runs a fused
        kernel on the device (`fused`, one per GPU type searched:
        kernel_rules.fused_attention_on), eager where it does not; both when the types
        differ, each type's runtime rules refusing the other's."""
        if self.attention:
            return self
        kinds = tuple(k for k, on in ((Attention.FLASH, any(fused)),
                                      (Attention.EAGER, not all(fused))) if on)
        return dataclasses.replace(self, attention=kinds)

    def summary(self) -> dict[str, Any]:
        out = {k: _enum_values(v) if isinstance(v, tuple) else v
               for k, v in dataclasses.asdict(self).items() if not isinstance(v, dict)}
        if self.grad_reduce_dtype == (None,):  # summarises as before: fingerprints still match
            out.pop("grad_reduce_dtype")
        for k in ("parallel", "pipeline", "offload", "recompute"):
            sub = getattr(self, k)
            out[k] = {f.name: None if getattr(sub, f.name) is None
                      else _enum_values(getattr(sub, f.name)) for f in dataclasses.fields(sub)}
        rc = typing.cast(dict[str, Any], out["recompute"])
        default = RecomputeSpace()
        rc["modules"] = [None if ms is None else _enum_values(ms) for ms in self.recompute.modules]
        # spaces without them summarise as before, so a stored study's fingerprint still matches
        for name in ("modules", "method"):
            if getattr(self.recompute, name) == getattr(default, name):
                rc.pop(name)
        if self.parallel.dp_shard == (None,):
            typing.cast(dict[str, Any], out["parallel"]).pop("dp_shard")
        for section, name, _ in AUTO_KNOBS:  # derived knobs summarise as spelled
            if getattr(getattr(self, section), name) is None:
                typing.cast(dict[str, Any], out[section])[name] = AUTO
        return out


def space_from_dict(data: Any, where: str = "space") -> SearchSpace:
    if not isinstance(data, dict):
        raise ConfigError(where, "the file is empty" if data is None else f"got {data!r}",
                          "expected a mapping of search-space fields (`autoplan spaces NAME "
                          "--shipped > FILE` writes a shipped one: not into the file it reads)")
    try:
        data = check_schema_version(data, "")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err.field}", err.problem, err.fix) from None
    data = read_auto(data, where)
    try:
        return from_dict(SearchSpace, listify(SearchSpace, data), "")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err.field}", err.problem, err.fix) from None


@dataclass(frozen=True)
class LoadedSpace(SearchSpace):
    """A space as `load_space` read it, named as the user gave it (space_label): headers,
    summary.json and report.html show `name`, which may be a path. Study fingerprints hold
    the file's own `name:` (summary), so a study resumes whatever path its space is given by."""

    name_in_file: str = ""
    """The file's `name:`."""

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        del out["name_in_file"]
        return {**out, "name": self.name_in_file}


def load_space(ref: str | Path) -> SearchSpace:
    """A search space by name (the user's space directory, then the built-in ones) or by path,
    named as it was given (space_label)."""
    given = str(ref)
    path = space_path(ref)
    named = resources.is_name(ref)
    user = named and path.parent.resolve() != SPACES_DIR.resolve()
    space = space_from_dict(read_yaml(path, "--space"), f"space {path if user else path.name}")
    if named and space.name != given:
        _warn_inner_name(given, str(path), space.name)
    label = space_label(given, space.name, path if user else None)
    if label == space.name:
        return space
    fields = {f.name: getattr(space, f.name) for f in dataclasses.fields(space)}
    return LoadedSpace(**{**fields, "name": label}, name_in_file=space.name)


@functools.cache
def _warn_inner_name(ref: str, path: str, inner: str) -> None:
    """Say once per file that its `name:` is not the name it is found by (as for profiles:
    hardware._warn_inner_name)."""
    rename = "" if inner in available_spaces() else f", or rename the file {inner}.yaml"
    log.warning("space %s (%s) says name: %s; a space is found by its file name, so --space "
                "takes %s, not %s: set name: %s in it%s", ref, path, inner, ref, inner, ref,
                rename)
