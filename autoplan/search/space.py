"""Enumerate a SearchSpace as a candidate table: the cartesian product by mixed-radix index
arithmetic in numpy (no Python loop over candidates).

The parallel layouts (num_gpus, tp, pp, cp) come first; dp is derived as num_gpus / (tp*pp*cp),
and layouts it cannot fill are counted as "world-size" rejections without being materialised.
Validity rules and scoring are left to `autoplan.search.scoring`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec
from autoplan.plan import RecomputePolicy, Schedule
from autoplan.plan_table import COLUMNS, RECOMPUTE, SCHEDULES, even_layers
from autoplan.search_space import SearchSpace

EXTRA_COLUMNS = {"num_gpus": np.int64, "precision": np.int64, "attention": np.int64,
                 "layers_last": np.int64, "split": np.int64}
"""Columns beyond plan_table.COLUMNS: precision/attention are indexes into the space's lists,
split 0 is even and 1 balanced."""
MAX_GPU_COUNTS = 4096
"""Most GPU counts one search scores (a range keeps powers of two and whole nodes)."""
MAX_GPUS = 2**20
"""Largest GPU count a search takes (1,048,576; today's largest clusters hold ~10^5 GPUs)."""
MAX_ROWS = 20_000_000
"""Most candidates the exhaustive search holds in memory at once (about 300 bytes each while
they are scored: ~6 GB); larger spaces go to the Optuna samplers."""


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


def parse_gpu_counts(text: str, gpus_per_node: int) -> tuple[int, ...]:
    """`N`, `A,B,C` or `A..B` (every count in [A, B] that is a power of two or a multiple of
    gpus_per_node, i.e. whole nodes), each at most MAX_GPUS."""
    where, fix = "--num-gpus", "write N, A,B,C or A..B, e.g. 64..1024"
    try:
        if ".." in text:
            lo_s, _, hi_s = text.partition("..")
            lo, hi = int(lo_s), int(hi_s)
            if lo < 1 or hi < lo:
                raise ConfigError(where, f"got {text!r}", "the range needs 1 <= A <= B")
            values = [lo, hi]
        else:
            values = [int(x) for x in text.split(",")]
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


def recompute_pairs(space: SearchSpace) -> list[tuple[int, int]]:
    """(policy code, num_layers or -1) pairs; policy none only with -1 (num_layers is moot)."""
    pairs = []
    for policy in space.recompute.policy:
        code = RECOMPUTE.index(policy)
        if policy is RecomputePolicy.NONE:
            pairs.append((code, -1))
        else:
            pairs += [(code, -1 if n is None else n) for n in space.recompute.num_layers]
    return pairs


@dataclass(frozen=True)
class Enumeration:
    table: dict[str, np.ndarray]
    """Candidate columns (plan_table.COLUMNS + EXTRA_COLUMNS), one row per candidate."""
    world_size_rejected: int
    """Candidates whose tp*pp*cp does not fill the GPU count (or gives a dp not allowed)."""
    total: int
    """Every candidate of the space, rejected ones included."""


def layouts(space: SearchSpace, gpu_counts: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """Valid (num_gpus, dp, tp, pp, cp) rows and the number of (num_gpus, tp, pp, cp) misfits."""
    par = space.parallel
    grid = np.array(np.meshgrid(gpu_counts, par.tp, par.pp, par.cp, indexing="ij")).reshape(4, -1)
    n, tp, pp, cp = grid
    inner = tp * pp * cp
    ok = n % inner == 0
    dp = np.where(ok, n // np.maximum(inner, 1), 0)
    if par.dp is not None:
        ok &= np.isin(dp, par.dp)
    return np.stack([n, dp, tp, pp, cp])[:, ok], int((~ok).sum())


def check_rows(rows: int, limit: int | None) -> None:
    """Refuse, before anything is allocated, a table above `limit` or above MAX_ROWS."""
    if limit is not None and rows > limit:
        raise ConfigError("--sampler exhaustive", f"the space has {rows:,} candidates",
                          f"above max_enumerate={limit:,}; use --sampler tpe or a smaller space")
    if rows > MAX_ROWS:
        raise ConfigError("max_enumerate", f"the space has {rows:,} candidates to list (its "
                          f"max_enumerate is {limit or 0:,})", f"the exhaustive search holds at most "
                          f"{MAX_ROWS:,} (about 6 GB); lower max_enumerate so TPE takes "
                          "over, or shrink the space")


def enumerate_space(space: SearchSpace, model: ModelSpec, gpu_counts: tuple[int, ...],
                    global_batch_size: int, limit: int | None = None,
                    sample: int | None = None) -> Enumeration:
    """Every candidate of `space` for the given GPU counts, as numpy columns; with `sample`,
    at most that many of them drawn without repeats (seeded: the same draw every time)."""
    lay, misfits = layouts(space, gpu_counts)
    rc = np.array(recompute_pairs(space), dtype=np.int64).reshape(-1, 2)
    axes: list[tuple[str, np.ndarray]] = [
        ("sp", np.array(space.sequence_parallel, dtype=bool)),
        ("schedule", np.array([SCHEDULES.index(Schedule(s)) for s in space.pipeline.schedule])),
        ("vpp", np.array(space.pipeline.vpp)),
        ("zero_stage", np.array(space.zero_stage)),
        ("offload_optimizer", np.array(space.offload.optimizer, dtype=bool)),
        ("offload_params", np.array(space.offload.params, dtype=bool)),
        ("rc_pair", np.arange(len(rc))),
        ("mbs", np.array(space.micro_batch_size)),
        ("precision", np.arange(len(space.precision))),
        ("attention", np.arange(len(space.attention))),
    ]
    rest = math.prod(len(v) for _, v in axes)
    total = (lay.shape[1] + misfits) * rest
    rows = lay.shape[1] * rest
    if sample is None:
        check_rows(rows, limit)
        idx = np.arange(rows, dtype=np.int64)
    elif rows > sample:
        idx = np.sort(np.random.default_rng(0).choice(rows, sample, replace=False))
        rows = sample
    else:
        idx = np.arange(rows, dtype=np.int64)
    lay_idx, rem = np.divmod(idx, rest)
    t: dict[str, np.ndarray] = {}
    for name, values in reversed(axes):  # last axis varies fastest
        rem, k = np.divmod(rem, len(values))
        t[name] = values[k]
    for j, name in enumerate(("num_gpus", "dp", "tp", "pp", "cp")):
        t[name] = lay[j][lay_idx]
    pair = t.pop("rc_pair")
    t["recompute"], t["recompute_layers"] = rc[pair, 0], rc[pair, 1]
    t["gbs"] = np.full(rows, global_batch_size, dtype=np.int64)
    layers = even_layers(model, t["pp"]).astype(np.int64)
    t["layers_max"] = t["layers_first"] = t["layers_last"] = layers
    t["split"] = np.zeros(rows, dtype=np.int64)
    dtypes = {**COLUMNS, **EXTRA_COLUMNS}
    table = {k: np.ascontiguousarray(t[k], dtype=dtypes[k]) for k in dtypes}
    return Enumeration(table, misfits * rest, total)
