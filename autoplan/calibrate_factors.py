"""The multipliers calibrate fits (FACTORS: compute peak, memory bandwidth, links, measured
collective tables and host overheads, per-operator dispatch, overlap), apply_factors to put them
into a profile, and which of them a profile gives any effect (active_factors)."""

from __future__ import annotations

import dataclasses

from autoplan.hardware import ClusterProfile, CollectiveTimes, LinkSpec, TimeTable

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
                  "fsdp_unit_overhead_s", "optimizer_overhead_s", "dtensor_optimizer_overhead_s")
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
