"""What `--cluster`, `--num-gpus`, `--price` and `--precision` name for a search: the GPU types it
prices (a profile each, with its GPU counts and price per GPU-hour) and the precisions it tries."""

from __future__ import annotations

import dataclasses

from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.plan import Precision
from autoplan.search.engine import GpuType
from autoplan.search.ranges import parse_gpu_counts
from autoplan.search_space import SearchSpace


def common_format(types: tuple[GpuType, ...]) -> str:
    """' NAME' for --precision's fix: the narrowest format every type has a peak for."""
    common = [p.value for p in (Precision.BF16, Precision.FP16, Precision.FP32)
              if all(p.value in t.profile.device.peak_flops_per_s for t in types)]
    return f" {common[0]} (every type runs it)" if common else ""


def with_precisions(space: SearchSpace, text: str | None) -> SearchSpace:
    """The space with --precision's list in place of its own (`auto`: each device's own, as
    SearchSpace.for_device settles it)."""
    if text is None:
        return space
    names = [n.strip() for n in text.split(",")]
    if names == ["auto"]:
        return dataclasses.replace(space, precision=())
    known = [p.value for p in Precision]
    for name in names:
        if name not in known:
            raise ConfigError("--precision", f"got {name!r} in {text!r}",
                              f"list some of {', '.join(known)} (comma-separated), or auto")
    if len(set(names)) != len(names):
        raise ConfigError("--precision", f"got {text!r} with repeats", "list each once")
    return dataclasses.replace(space, precision=tuple(Precision(n) for n in names))


def gpu_types(cluster: str, num_gpus: str, price: str | None) -> tuple[GpuType, ...]:
    """The profiles of --cluster (one, or several comma-separated), each with its GPU counts
    and its price per GPU-hour (--price NAME=USD overrides the profile's)."""
    refs = [c.strip() for c in cluster.split(",") if c.strip()] if "," in cluster else [cluster]
    if not refs or len(set(refs)) != len(refs):
        raise ConfigError("--cluster", f"got {cluster[:80]!r}", "name each profile once")
    profiles = {ref: load_profile(ref) for ref in refs}
    names = [p.name for p in profiles.values()]
    # a profile given by path is priced by its path or, where no other shares it, its name
    aliases = {**{p.name: ref for ref, p in profiles.items() if names.count(p.name) == 1},
               **{ref: ref for ref in refs}}
    prices = parse_prices(price, aliases)
    out = []
    for ref, prof in profiles.items():
        if ref in prices:
            prof = dataclasses.replace(prof, price_per_gpu_hour=prices[ref])
        out.append(GpuType(ref, prof, parse_gpu_counts(num_gpus, prof.gpus_per_node)))
    return tuple(out)


def parse_prices(text: str | None, refs: dict[str, str]) -> dict[str, float]:
    """--price NAME=USD,NAME=USD as {--cluster reference: dollars per GPU-hour}; `refs` maps
    each name a price may give (a reference as typed, or a file profile's own name) to the
    --cluster reference it prices."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        name = name.strip()
        try:
            usd = float(value)
        except ValueError:
            usd = float("nan")
        if not eq or not name or usd != usd:  # NaN: no number after the =
            raise ConfigError("--price", f"got {item[:80]!r}",
                              "write NAME=USD per GPU-hour, e.g. h100-sxm-80gb=2.99")
        if not 0 < usd < 1e6:
            raise ConfigError("--price", f"got {item[:80]!r}", "expected a price per GPU-hour "
                              "above 0 and below 1,000,000 US dollars")
        if name not in refs:
            raise ConfigError("--price", f"{name!r} is not in --cluster",
                              f"price one of {', '.join(refs)}")
        out[refs[name]] = usd
    return out
