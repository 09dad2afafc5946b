"""Refuse, before any candidate is scored, a precision list that no GPU type of --cluster runs:
every candidate would be precision-unsupported, so the search spent minutes and then exited 3
(user test 36: 1,977,696 V100 candidates for --precision bf16,fp8). search.cli calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile
from autoplan.plan import Precision
from autoplan.search_space import SearchSpace, device_precision


def check_runnable(space: SearchSpace, types: Sequence[tuple[str, ClusterProfile]],
                   flag: str | None, space_ref: str) -> None:
    """Refuse `space`'s precision list (from --precision `flag`, or from the space
    `space_ref` where no flag was given) when no profile of `types` (--cluster reference,
    profile) has a peak for any format in it. `auto` (an empty list) always passes: each
    device settles its own. One type that runs one listed format is enough (the others' rows
    count as precision-unsupported, as an A100 beside an H100 lacks fp8)."""
    listed = [p.value for p in space.precision]
    if not listed or any(p in prof.device.peak_flops_per_s for _, prof in types for p in listed):
        return
    picks = [device_precision(prof.device.peak_flops_per_s, prof.is_cpu) for _, prof in types]
    pick = next((p for p in picks if all(p in prof.device.peak_flops_per_s
                                          for _, prof in types)), picks[0])
    if len(types) == 1:
        ref, prof = types[0]
        runs = f"which {prof.device.name} ({ref}) does not run: it runs {_formats(prof)}"
    else:
        runs = "which no GPU type of --cluster runs (" + "; ".join(
            f"{ref} runs {_formats(prof)}" for ref, prof in types) + ")"
    # `auto` only where it settles alike for every type (search refuses types that differ)
    auto = ", or auto (each GPU's own format)" if len(set(picks)) == 1 else ""
    if flag is not None:
        raise ConfigError("--precision", f"got {flag!r}, {runs}", f"give --precision {pick}{auto}")
    raise ConfigError("--space", f"{space_ref!r} lists precision [{', '.join(listed)}], {runs}",
                      f"list {pick} in its precision, or give --precision {pick}{auto}")


def _formats(profile: ClusterProfile) -> str:
    """The training precisions the device has a peak for (not tf32, a matmul mode)."""
    known = {p.value for p in Precision}
    return ", ".join(k for k in profile.device.peak_flops_per_s if k in known)
