"""A hardware profile: the ClusterProfile that joins a node type's efficiency figures
(hardware_efficiency) to its datasheet figures (hardware_devices), and loading one from
profiles/NAME.yaml (profile_files finds the file; ClusterSpec adds the GPU count).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan import resources
from autoplan.errors import ConfigError
from autoplan.hardware_devices import DeviceSpec, HostSpec, LinkSpec
from autoplan.hardware_efficiency import (  # re-exported: a profile's parts, by one import
    ATTENTION_HEAD_DIM,
    ATTENTION_KERNELS,
    AttentionFigure,
    AttentionFigures,
    CollectiveTimes,
    Curve,
    Efficiency,
    TimeTable,
    scale_figure,
)
from autoplan.profile_files import profile_path
from autoplan.profile_measured import check_measured, device_compute
from autoplan.yaml_io import check_schema_version, from_dict, read_yaml

__all__ = ["ATTENTION_HEAD_DIM", "ATTENTION_KERNELS", "MAX_GPUS_PER_NODE", "PROFILES_DIR",
           "AttentionFigure", "AttentionFigures", "ClusterProfile", "ClusterSpec",
           "CollectiveTimes", "Curve", "DeviceSpec", "Efficiency", "TimeTable", "cluster",
           "load_profile", "profile_from_dict", "scale_figure"]

log = logging.getLogger(__name__)

PROFILES_DIR = resources.package_dir(resources.PROFILES)
"""The built-in profiles (package data); a user directory is searched first (autoplan.resources)."""
# Far outside any real hardware (2026: 72 GPUs in the largest NVLink domain): a typo or a unit
# slip, refused on load (hardware_efficiency and hardware_devices bound the rest alike).
MAX_GPUS_PER_NODE = 1024


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    device: DeviceSpec
    gpus_per_node: int
    intra_node: LinkSpec
    inter_node: LinkSpec
    host: HostSpec
    efficiency: Efficiency
    description: str = ""
    collectives: CollectiveTimes | None = None
    """Measured seconds per collective call by size and group (CPU hosts and profiled GPUs)."""
    measured: dict[str, Any] | None = None
    """Written by `autoplan profile`: measured curves and the conditions they were taken in."""
    price_per_gpu_hour: float | None = None
    """US dollars per GPU-hour, an example list price for `search --objective cost` across GPU
    types (override with `search --price NAME=USD`); null: cost in GPU-hours only."""

    @property
    def is_cpu(self) -> bool:
        """A CPU host, whose ranks time-share its `host.compute_slots` cores, not a GPU node."""
        return self.host.compute_slots is not None

    @property
    def calibrated_compute(self) -> float:
        """The multiplier `autoplan calibrate` folded into device.peak_flops_per_s, over every
        fit of a chain (a calibrated profile calibrated again); 1 for a profile it did not fit.
        The fitted peak times the profile's efficiencies is the rate plans are priced at; MFU is
        stated against the device's own peak, this divided back out (cost.estimate)."""
        return device_compute(self.measured)

    def __post_init__(self) -> None:
        if not 1 <= self.gpus_per_node <= MAX_GPUS_PER_NODE:
            raise ConfigError("gpus_per_node", f"got {self.gpus_per_node}",
                              f"expected 1 to {MAX_GPUS_PER_NODE} GPUs in one node")
        if self.measured is not None:
            check_measured(self.measured)
        price = self.price_per_gpu_hour
        if price is not None and not (isinstance(price, (int, float)) and 0 < price < 1e6):
            raise ConfigError("price_per_gpu_hour", f"got {price!r}",
                              "expected US dollars per GPU-hour, e.g. 2.5, or null")


@dataclass(frozen=True)
class ClusterSpec:
    """A profile and a GPU count: the machine a plan is scored for."""

    profile: ClusterProfile
    num_gpus: int

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ConfigError("--num-gpus", f"got {self.num_gpus}", "expected a positive integer")

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.profile.gpus_per_node)

    @property
    def gpus_per_node(self) -> int:
        return min(self.num_gpus, self.profile.gpus_per_node)


def profile_from_dict(data: Any, where: str = "profile") -> ClusterProfile:
    if not isinstance(data, dict):
        raise ConfigError(where, f"got {data!r}", "expected a mapping of profile fields")
    return from_dict(ClusterProfile, check_schema_version(data, where), where)


def load_profile(ref: str | Path, flag: str = "--cluster") -> ClusterProfile:
    """A profile by name (the user's profile directory, then the built-in ones) or by path;
    `flag` names the option in errors about the reference, and every error about the file's
    contents names the profile and the file it was read from."""
    path = profile_path(ref, flag)
    # errors name the file: a user's profile may shadow a built-in name, a search read several
    where = f"profile {ref} ({path})" if resources.is_name(ref) else f"profile {str(path)!r}"
    profile = profile_from_dict(read_yaml(path, flag), where)
    if resources.is_name(ref) and profile.name != str(ref):
        _warn_inner_name(str(ref), str(path), profile.name)
    return profile


@functools.cache
def _warn_inner_name(ref: str, path: str, inner: str) -> None:
    """Say once per file that its `name:` is not the name it is found by."""
    log.warning("profile %s (%s) says name: %s; a profile is found by its file name, so "
                "--cluster takes %s, not %s: rename the file %s.yaml, or set name: %s in it",
                ref, path, inner, ref, inner, inner, ref)


def cluster(ref: str | Path, num_gpus: int) -> ClusterSpec:
    return ClusterSpec(load_profile(ref), num_gpus)
