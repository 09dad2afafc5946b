"""What the user typed for --num-gpus and --global-batch-size, as counts: a count, a list or
a range parsed and checked, and the global batch sizes a layout tries in a range. Crossing them
with the space's layouts is autoplan.search.space's."""

from __future__ import annotations

from autoplan.cli_common import BINARY_NOTE, scaled_count
from autoplan.errors import ConfigError

MAX_GPU_COUNTS = 4096
"""Most GPU counts one search scores (a range keeps powers of two and whole nodes)."""
MAX_GPUS = 2**20
"""Largest GPU count a search takes (1,048,576; today's largest clusters hold ~10^5 GPUs)."""


def _range_counts(lo: int, hi: int, gpus_per_node: int) -> list[int]:
    """Counts in [lo, hi] that are whole nodes or powers of two, counted before listed."""
    g = max(gpus_per_node, 1)
    first = -(-lo // g) * g
    nodes = range(first, hi + 1, g)
    powers = [1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi and (1 << k) % g]
    if len(nodes) + len(powers) > MAX_GPU_COUNTS:
        raise ConfigError("--num-gpus", f"{lo}..{hi} gives {len(nodes) + len(powers):,} GPU "
                          "counts", f"narrow the range to at most {MAX_GPU_COUNTS:,} counts "
                          f"(powers of two and multiples of {g} GPUs per node)")
    return sorted({*nodes, *powers})


def _integer(text: str) -> int:
    """A GPU count or batch size as cli_common reads every count: plain ASCII digits (int()
    alone also takes '８', '١٢' and '1_000'), or with a binary suffix (1k = 1024: both are
    powers of two in practice)."""
    if len(text.strip()) > 24:
        raise ValueError(text)
    return scaled_count(text, binary=True)


def parse_gpu_counts(text: str, gpus_per_node: int) -> tuple[int, ...]:
    """`N`, `A,B,C` or `A..B` (every count in [A, B] that is a power of two or a multiple of
    gpus_per_node, i.e. whole nodes), each at most MAX_GPUS."""
    where, fix = "--num-gpus", f"write N, A,B,C or A..B, e.g. 64..1024 or 64..1k ({BINARY_NOTE})"
    try:
        if ".." in text:
            lo_s, _, hi_s = text.partition("..")
            lo, hi = _integer(lo_s), _integer(hi_s)
            if lo < 1 or hi < lo:
                raise ConfigError(where, f"got {text!r}", "the range needs 1 <= A <= B")
            values = [lo, hi]
        else:
            values = [_integer(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(where, f"got {text[:80]!r}", fix) from None
    if not values or min(values) < 1:
        raise ConfigError(where, f"got {text[:80]!r}", "GPU counts must be positive; " + fix)
    if max(values) > MAX_GPUS:
        raise ConfigError(where, f"got {max(values)}",
                          f"a search takes at most {MAX_GPUS:,} GPUs")
    counts = _range_counts(lo, hi, gpus_per_node) if ".." in text else sorted(set(values))
    if not counts:
        raise ConfigError(where, f"{text!r} holds no power of two nor whole node of "
                          f"{gpus_per_node} GPUs", "widen the range or list the counts")
    if len(counts) > MAX_GPU_COUNTS:
        raise ConfigError(where, f"{text[:80]!r} gives {len(counts):,} counts",
                          f"list at most {MAX_GPU_COUNTS:,}")
    return tuple(counts)


def typed_range(text: str) -> tuple[int, int] | None:
    """--num-gpus as the user typed a range (A..B), None for one count or a list: the header
    names a range as a range and a list as the list (parse_gpu_counts has checked the text)."""
    if ".." not in text:
        return None
    lo, _, hi = text.partition("..")
    return _integer(lo), _integer(hi)


MAX_BATCH_SIZES = 64
"""Most global batch sizes one layout is crossed with under --global-batch-size A..B."""


def parse_batch_sizes(text: str) -> tuple[int, int]:
    """`B` or `A..B` as (A, B); a range lets the search pick the global batch size."""
    where, fix = ("--global-batch-size", "write sequences B or A..B, e.g. 1024..4096 or 1k..4k "
                  f"({BINARY_NOTE})")
    try:
        lo_s, dots, hi_s = text.partition("..")
        lo, hi = _integer(lo_s), _integer(hi_s) if dots else _integer(lo_s)
    except ValueError:
        raise ConfigError(where, f"got {text[:80]!r}", fix) from None
    if lo < 1 or hi < lo:
        raise ConfigError(where, f"got {text[:80]!r}", "expected 1 <= A <= B; " + fix)
    if hi > 2**24:
        raise ConfigError(where, f"got {hi}", "a search takes at most 16,777,216 sequences")
    return lo, hi


def batch_sizes(lo: int, hi: int, dp: int) -> list[int]:
    """Global batch sizes a layout of `dp` replicas tries in [lo, hi]: the powers of two and
    dp times a power of two (every replica gets a power-of-two share), at most
    MAX_BATCH_SIZES of them (the largest kept)."""
    if lo == hi:
        return [lo]
    out = {1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi}
    out |= {dp << k for k in range(max(hi // max(dp, 1), 1).bit_length()) if lo <= dp << k <= hi}
    return sorted(out)[-MAX_BATCH_SIZES:]
