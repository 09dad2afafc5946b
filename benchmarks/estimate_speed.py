"""Plans scored per second by the vectorised cost model on a 1,000,000-row table.

Builds a table of random (not necessarily valid) candidates for gpt3-175b on 1024 A100s, scores
it with estimate_table in one pass, and prints rows, seconds and plans/s (best of --repeats).

Run: python benchmarks/estimate_speed.py [--rows N] [--repeats K]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from autoplan.cost.estimate import estimate_table
from autoplan.hardware import load_profile
from autoplan.model_spec import PRESETS
from autoplan.plan_table import COLUMNS


def random_table(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 4, 8, 16], n)
    dp = 1024 // (tp * pp)
    vpp = np.where(pp > 1, rng.choice([1, 2, 3], n), 1)
    t = {
        "dp": dp, "tp": tp, "pp": pp, "cp": np.ones(n, int), "vpp": vpp,
        "sp": (tp > 1) & rng.choice([False, True], n), "schedule": rng.integers(0, 4, n),
        "zero_stage": rng.integers(0, 4, n), "offload_optimizer": rng.random(n) < 0.1,
        "offload_params": np.zeros(n, bool), "recompute": rng.integers(0, 3, n),
        "recompute_layers": -np.ones(n, int), "mbs": rng.choice([1, 2, 4], n),
        "gbs": np.full(n, 1536),
    }
    t["layers_max"] = t["layers_first"] = -(-96 // pp)
    return {k: np.asarray(v).astype(COLUMNS[k]) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model, profile = PRESETS["gpt3-175b"], load_profile("a100-sxm4-80gb")
    table = random_table(args.rows)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = estimate_table(table, model, profile, "bf16", "flash")
        best = min(best, time.perf_counter() - start)
    assert np.isfinite(out["time_step"]).all()
    print(f"rows {args.rows:,}  best of {args.repeats}: {best:.3f} s  "
          f"{args.rows / best:,.0f} plans/s")


if __name__ == "__main__":
    main()
