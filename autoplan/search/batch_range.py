"""A `--global-batch-size A..B` range that no layout can take, refused before any search.

The sizes a layout tries are ranges.batch_sizes': powers of two and dp x 2^k inside the range.
A range with none for every dp the GPU counts allow would leave the exhaustive search with no
candidate and every sampled trial rejected, so it is bad input (exit 2), not an infeasible plan.
"""

from __future__ import annotations

import numpy as np

from autoplan.errors import ConfigError
from autoplan.search.ranges import batch_sizes
from autoplan.search.space import layouts
from autoplan.search_space import SearchSpace

SHOWN = 8
"""Most GPU counts and data-parallel degrees the refusal names."""


def tried_sizes(dps: list[int], below: int, above: int) -> tuple[int | None, int | None]:
    """The largest size under `below` and the smallest over `above` that some dp tries (a power
    of two or dp x 2^k); None on a side with none (no size under 1)."""
    under, over = None, None
    for base in {1, *dps}:
        if base < below:  # base x the largest power of two that keeps it under `below`
            size = base << (((below - 1) // base).bit_length() - 1)
            under = max(under or 0, size)
        size = base << max(-(-(above + 1) // base) - 1, 0).bit_length()  # first past `above`
        over = size if over is None else min(over, size)
    return under, over


def check_batch_range(space: SearchSpace, gpu_counts: tuple[int, ...],
                      batch: tuple[int, int]) -> None:
    """Refuse, in one line, a batch range that holds no size any layout of the space tries on
    these GPU counts, naming the nearest sizes that one would take. A single size, or GPU
    counts no layout fills (the search reports those as world-size), pass."""
    lo, hi = batch
    dps = sorted({int(d) for d in np.unique(layouts(space, gpu_counts)[0][1])})
    if lo == hi or not dps or any(batch_sizes(lo, hi, d) for d in dps):
        return
    under, over = tried_sizes(dps, lo, hi)
    reach = " or ".join(f"{s:,}" for s in (under, over) if s is not None)
    counts, shown = _listed(list(gpu_counts)), _listed(dps)
    raise ConfigError("--global-batch-size", f"{lo}..{hi} holds no size the search tries on "
                      f"{counts} GPUs (powers of two and dp x 2^k, dp in {shown})",
                      f"widen the range to take {reach}, or give one size (a multiple of dp x "
                      "the micro-batch size)")


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values[:SHOWN])) + (", ..." if len(values) > SHOWN else "")
