"""The multipliers calibrate fits (FACTORS: compute peak, memory bandwidth, links, measured
collective tables and host overheads, per-operator dispatch, overlap), apply_factors to put them
into a profile, and which of them a profile gives any effect (active_factors)."""

from __future__ import annotations

import dataclasses

from autoplan.hardware import ClusterProfile, CollectiveTimes, TimeTable
from autoplan.hardware_devices import LinkSpec

FACTORS = {  # name: (low, high, log scale)
    "compute": (0.1, 10.0, True),
    "memory_bandwidth": (0.1, 10.0, True),
    "link_bandwidth": (0.1, 10.0, True),
    "link_latency": (0.1, 10.0, True),
    "collective_tables": (0.1, 10.0, True),
    "op_overhead_s": (1e-7, 1e-3, True),
    "host_overheads": (0.1, 10.0, True),
    "overlap": (0.0, 1.0, False),
}


HOST_OVERHEADS = ("dtensor_op_overhead_s", "checkpoint_op_overhead_s", "selective_op_overhead_s",
                  "fsdp_unit_overhead_s", "optimizer_overhead_s", "dtensor_optimizer_overhead_s",
                  "tp_collective_overhead_s")
"""Measured host costs that `host_overheads` scales together (one host, one speed)."""


def apply_factors(profile: ClusterProfile, f: dict[str, float]) -> ClusterProfile:
    """`profile` with each multiplier of `f` applied (FACTORS) and its op_overhead_s and overlap
    set to f's values."""
    dev = profile.device
    device = dataclasses.replace(
        dev, peak_flops_per_s={k: v * f["compute"] for k, v in dev.peak_flops_per_s.items()},
        hbm_bytes_per_s=dev.hbm_bytes_per_s * f["memory_bandwidth"])

    def link(spec: LinkSpec) -> LinkSpec:
        return LinkSpec(spec.bytes_per_s * f["link_bandwidth"], spec.latency_s * f["link_latency"])

    eff = profile.efficiency
    eff = dataclasses.replace(
        eff, op_overhead_s=f["op_overhead_s"], overlap=f["overlap"],
        **{name: getattr(eff, name) * f["host_overheads"] for name in HOST_OVERHEADS})
    return dataclasses.replace(profile, device=device, intra_node=link(profile.intra_node),
                               inter_node=link(profile.inter_node), efficiency=eff,
                               collectives=_scaled(profile.collectives, f["collective_tables"]))


def _scaled(tables: CollectiveTimes | None, factor: float) -> CollectiveTimes | None:
    """The measured collective tables with every time multiplied by `factor`."""
    if tables is None:
        return None
    return CollectiveTimes(**{
        kind: {g: TimeTable(t.x, tuple(y * factor for y in t.y)) for g, t in by_group.items()}
        for kind, by_group in vars(tables).items() if by_group})


def identity(profile: ClusterProfile) -> dict[str, float]:
    """The factors apply_factors leaves `profile` as it is with: the fit's start (op_overhead_s
    raised to FACTORS' lower bound where the profile's is below it)."""
    return {"compute": 1.0, "memory_bandwidth": 1.0, "link_bandwidth": 1.0, "link_latency": 1.0,
            "collective_tables": 1.0, "host_overheads": 1.0,
            "op_overhead_s": max(profile.efficiency.op_overhead_s, 1e-7),
            "overlap": profile.efficiency.overlap}


def active_factors(profile: ClusterProfile) -> dict[str, tuple[float, float, bool]]:
    """FACTORS less those this profile gives no effect (no measured collective tables, no
    measured host overheads)."""
    return {k: v for k, v in FACTORS.items() if k not in profile_lacks(profile)}


def profile_lacks(profile: ClusterProfile) -> dict[str, str]:
    """The factors `profile` gives nothing to scale, with the reason."""
    out = {}
    if profile.collectives is None:
        out["collective_tables"] = "the profile has no measured collective tables"
    if not any(getattr(profile.efficiency, name) for name in HOST_OVERHEADS):
        out["host_overheads"] = "the profile has no measured host overheads"
    return out


FAR = 10.0
"""A fitted field moved by more than this factor either way is flagged (calibrate_cli): the
multipliers' own range ends there, and a measured value rarely errs by as much."""


def _collective_field(profile: ClusterProfile) -> tuple[str, float] | None:
    """One time of the measured collective tables, all of which collective_tables scales: the
    first kind's smallest group at its largest message."""
    for kind, by_group in vars(profile.collectives or CollectiveTimes()).items():
        if by_group:
            group = min(by_group)
            table = by_group[group]
            size = table.x[-1]
            shown = f"{size / 2**20:.3g} MiB" if size >= 2**20 else f"{size:.0f} B"
            return f"collectives.{kind}[{group}] {shown}", table.y[-1]
    return None


def factor_fields(profile: ClusterProfile, precision: str) -> dict[str, tuple[str, float]]:
    """The field of `profile` each factor moves, as one representative (name, value): the
    peak in `precision` for compute (every peak moves alike), the GPU links' intra-node figure
    (inter-node moves alike), the first host overhead measured."""
    dev, eff = profile.device, profile.efficiency
    fields = {
        "compute": (f"device.peak_flops_per_s.{precision}", dev.peak_flops_per_s[precision]),
        "memory_bandwidth": ("device.hbm_bytes_per_s", dev.hbm_bytes_per_s),
        "link_bandwidth": ("intra_node.bytes_per_s", profile.intra_node.bytes_per_s),
        "link_latency": ("intra_node.latency_s", profile.intra_node.latency_s),
        "op_overhead_s": ("efficiency.op_overhead_s", eff.op_overhead_s),
        "overlap": ("efficiency.overlap", eff.overlap),
    }
    host = next((name for name in HOST_OVERHEADS if getattr(eff, name)), None)
    if host is not None:
        fields["host_overheads"] = (f"efficiency.{host}", getattr(eff, host))
    collective = _collective_field(profile)
    if collective is not None:
        fields["collective_tables"] = collective
    return fields


def ratio(before: float, after: float) -> float | None:
    """after / before: 1 for a value left as it was, None where it moved from 0 (overlap)."""
    if after == before:
        return 1.0
    return after / before if before else None


def fitted_values(before: ClusterProfile, after: ClusterProfile, names: list[str],
                  precision: str) -> dict[str, dict[str, object]]:
    """For each factor of `names` (those fitted), the field it moved: its name, its value
    before and after, and their ratio; and device.reserved_bytes where the memory fit raised
    it. `precision`: the peak shown for compute."""
    was, now = factor_fields(before, precision), factor_fields(after, precision)
    out: dict[str, dict[str, object]] = {}
    for name in names:
        if name in was:
            (field, a), (_, b) = was[name], now[name]
            out[name] = {"field": field, "before": a, "after": b, "ratio": ratio(a, b)}
    a, b = before.device.reserved_bytes, after.device.reserved_bytes
    if a != b:
        out["reserved_bytes"] = {"field": "device.reserved_bytes", "before": a, "after": b,
                                 "ratio": ratio(a, b)}
    return out


def moved_far(values: dict[str, dict[str, object]]) -> list[str]:
    """The fields of fitted_values that moved by more than FAR either way."""
    far = []
    for name, v in values.items():
        r = v["ratio"]
        if isinstance(r, float) and r > 0 and max(r, 1 / r) > FAR:
            far.append(name)
    return far
