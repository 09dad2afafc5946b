"""Search spaces: the allowed values of every plan knob (search_spaces/NAME.yaml, DESIGN.md s7).

Loaded strictly like plans: unknown keys list the valid ones, schema_version is checked, and each
bad value is a one-line ConfigError naming the field, the value and the fix. Enumerating or
sampling the space is left to `autoplan.search`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.plan import Attention, Precision, RecomputePolicy, Schedule
from autoplan.yaml_io import check_schema_version, from_dict, read_yaml

SPACES_DIR = resources.package_dir(resources.SPACES)
"""The built-in spaces (package data); a user directory is searched first (autoplan.resources)."""
ENUMERABLE_LIMIT = 5_000_000
"""Default ceiling on candidates for the exhaustive sampler; larger spaces go to Optuna."""


class Split(str, enum.Enum):
    """How layers are assigned to pipeline stages."""

    EVEN = "even"
    BALANCED = "balanced"
    """Fewer blocks on the stages that also hold the embedding or the output layer, balancing
    their time over the model's layer graph (autoplan.search.partition)."""


def _check_values(name: str, values: tuple[Any, ...], *, low: int | None = None,
                  high: int | None = None, example: str = "") -> None:
    if not values:
        raise ConfigError(name, "got an empty list", f"list at least one value{example}")
    if len(set(values)) != len(values):
        raise ConfigError(name, f"got {list(values)} with repeats", "list each value once")
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
    (autoplan.search.space.expert_pairs)."""
    etp: tuple[int, ...] = (1,)
    """Expert tensor-parallel degrees (each routed expert split over etp ranks)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "cp", "etp"):
            _check_values(name, getattr(self, name), low=1, example=", e.g. [1, 2, 4, 8]")
        if self.ep is not None:
            _check_values("ep", self.ep, low=1, example=", or null (from the model)")
        if self.dp is not None:
            _check_values("dp", self.dp, low=1, example=", or null for any")


@dataclass(frozen=True)
class PipelineSpace:
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B,)
    """Pipeline schedules (only matter when pp > 1)."""
    vpp: tuple[int, ...] = (1,)
    """Virtual stages per rank (> 1 needs interleaved-1f1b or zero-bubble)."""
    split: tuple[Split, ...] = (Split.EVEN,)
    """even | balanced layer-to-stage split; balanced is searched by the Optuna samplers only."""

    def __post_init__(self) -> None:
        _check_values("schedule", self.schedule)
        _check_values("vpp", self.vpp, low=1, example=", e.g. [1, 2, 4]")
        _check_values("split", self.split)


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

    def __post_init__(self) -> None:
        _check_values("policy", self.policy)
        _check_values("num_layers", self.num_layers, low=1,
                      example=" or null (all layers), e.g. [null, 1, 2, 4]")


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
    precision: tuple[Precision, ...] = (Precision.BF16,)
    """Training precisions (bf16 | fp16 | fp32)."""
    attention: tuple[Attention, ...] = (Attention.FLASH,)
    """Attention kernels (flash | eager)."""
    max_enumerate: int = ENUMERABLE_LIMIT
    """Largest candidate count the default sampler enumerates; above it, TPE."""

    def __post_init__(self) -> None:
        _check_values("sequence_parallel", self.sequence_parallel)
        _check_values("zero_stage", self.zero_stage, low=0, high=3)
        _check_values("micro_batch_size", self.micro_batch_size, low=1,
                      example=", e.g. [1, 2, 4]")
        _check_values("precision", self.precision)
        _check_values("attention", self.attention)
        if self.max_enumerate < 1:
            raise ConfigError("max_enumerate", f"got {self.max_enumerate}",
                              "expected a positive integer")

    def knob_sizes(self) -> dict[str, int]:
        """Number of values of each independently enumerated knob (dp is derived)."""
        policies = len(self.recompute.policy)
        has_none = RecomputePolicy.NONE in self.recompute.policy
        rc_pairs = (policies - has_none) * len(self.recompute.num_layers) + has_none
        return {
            "tp": len(self.parallel.tp), "pp": len(self.parallel.pp), "cp": len(self.parallel.cp),
            "sp": len(self.sequence_parallel), "schedule": len(self.pipeline.schedule),
            "vpp": len(self.pipeline.vpp), "zero_stage": len(self.zero_stage),
            "offload_optimizer": len(self.offload.optimizer),
            "offload_params": len(self.offload.params), "recompute": rc_pairs,
            "mbs": len(self.micro_batch_size), "precision": len(self.precision),
            "attention": len(self.attention),
        }

    def size(self, num_gpu_counts: int = 1) -> int:
        """Candidates the exhaustive sampler generates (before any rule) for that many GPU counts;
        an uneven split multiplies the count for Optuna but is not enumerated."""
        return math.prod(self.knob_sizes().values()) * num_gpu_counts

    def summary(self) -> dict[str, Any]:
        out = {k: _enum_values(v) if isinstance(v, tuple) else v
               for k, v in dataclasses.asdict(self).items() if not isinstance(v, dict)}
        for k in ("parallel", "pipeline", "offload", "recompute"):
            sub = getattr(self, k)
            out[k] = {f.name: None if getattr(sub, f.name) is None
                      else _enum_values(getattr(sub, f.name)) for f in dataclasses.fields(sub)}
        return out


def _listify(cls: type, data: Any) -> Any:
    """Accept a scalar wherever a list of values is expected (`precision: bf16`)."""
    if not isinstance(data, dict):
        return data
    hints = typing.get_type_hints(cls)
    out = dict(data)
    for name, value in data.items():
        tp = hints.get(name)
        if tp is None:
            continue
        union = typing.get_origin(tp) in (typing.Union, types.UnionType)
        inner = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
        if dataclasses.is_dataclass(inner[0]):
            out[name] = _listify(inner[0], value)  # type: ignore[arg-type]
        elif typing.get_origin(inner[0]) is tuple and value is not None \
                and not isinstance(value, list):
            out[name] = [value]
    return out


def space_from_dict(data: Any, where: str = "space") -> SearchSpace:
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {data!r}", "expected a mapping of search-space fields")
    data = check_schema_version(data, "")
    try:
        return from_dict(SearchSpace, _listify(SearchSpace, data), "")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err.field}", err.problem, err.fix) from None


def available_spaces() -> list[str]:
    """Space names: the user's directory ($AUTOPLAN_SPACES) and the built-in ones."""
    return resources.names(resources.SPACES)


def load_space(ref: str | Path) -> SearchSpace:
    """A search space by name (the user's space directory, then the built-in ones) or by path."""
    path = Path(ref)
    if resources.is_name(ref):
        named = resources.find(resources.SPACES, str(ref))
        if named is None:
            raise ConfigError("--space", f"no search space named {str(ref)!r}",
                              f"choose one of {', '.join(available_spaces())} or give a path")
        path = named
    return space_from_dict(read_yaml(path, "--space"), f"space {path.name}")
