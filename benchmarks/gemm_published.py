"""The cost model's GEMM prices against published kernel measurements, by size.

benchmarks/data/gemm-published.yaml holds GEMMs measured by others on the GPUs the datasheet
profiles describe: XLA's H100 cost table (375 shapes, every b in 1, 2, 4 and m, n, k in
256 ... 4096), Azure's A100 cuBLASLt table and its H100 and H200 cuBLASLt FP8 tables, from which
each profile's `efficiency.fp8_matmul` is read (fp8_matmul). For each GEMM this prints the
share of the peak it ran at and the share the cost model runs it at (gemm_shapes.predicted_share:
the profile's matmul curve for the GEMM's padded FLOPs after the tile/wave quantization of its
output, as a block's GEMMs are priced, an FP8 one's times fp8_matmul), grouped by FLOPs, and the
same with the curve alone (no quantization), so each of the two parts is seen against kernels
that measured them.

Read it knowing how each set timed: one GPU at burst clocks, the kernel alone. The profiles'
curves top out at a rate held with every GPU of a node loaded (their comments: 727 of
794.5 TFLOP/s best-shape burst on the GH100 die), so priced/measured about 1.09 on the largest
GEMMs is the clock, not an error; in-training GEMMs also share the GPU with collectives and
read operands a microbenchmark's loop finds in cache. The table measures the GEMM part alone;
whether a change to it makes whole runs better is published_accuracy.py's to say.

Run: python benchmarks/gemm_published.py [--data PATH] [--format table|json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from autoplan.cost import block_time, compute
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.yaml_io import read_yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_shapes import predicted_share  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "gemm-published.yaml"
DECADES = (1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14)
"""Bin edges (FLOPs of one GEMM, 2 b m n k) the table groups by."""
ROW_FIELDS = ("b", "m", "n", "k", "tflops")


def load_sets(path: Path) -> list[dict[str, Any]]:
    """The measurement sets of `path`, each row checked: five positive numbers, a rate below the
    profile's peak for the set's precision."""
    data = read_yaml(path, "--data")
    sets = data.get("sets") if isinstance(data, dict) else None
    if not isinstance(sets, list) or not sets:
        raise ConfigError("--data", f"{path} has no `sets` list", "give a gemm-published file")
    for s in sets:
        peak = load_profile(s["profile"]).device.peak(s["precision"])
        for i, row in enumerate(s["rows"]):
            if (len(row) != len(ROW_FIELDS) or any(not isinstance(v, (int, float)) or v <= 0
                                                   for v in row)):
                raise ConfigError(f"{s['id']}.rows[{i}]", f"got {row}",
                                  f"give [{', '.join(ROW_FIELDS)}], all positive")
            if row[4] * 1e12 > peak:
                raise ConfigError(f"{s['id']}.rows[{i}]", f"{row[4]} TFLOP/s",
                                  f"is above the {s['profile']} {s['precision']} peak")
    return sets


def compare(s: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per GEMM of set `s`: its FLOPs and the measured, priced and curve-alone shares
    of the peak. A batch of b GEMMs is priced as one of b*m rows (the same output tiles: every
    m here is a multiple of the tile's rows, as a block folds its tokens into m)."""
    profile = load_profile(s["profile"])
    peak = profile.device.peak(s["precision"])
    priced_at = block_time.profile_gemm_peak(profile, s["precision"])
    out = []
    for b, m, n, k, tflops in s["rows"]:
        flops = 2.0 * b * m * n * k
        curve = float(flops / (compute.gemm_time_s(np.array([flops]), profile, priced_at)[0]
                               * peak))
        out.append({"b": b, "m": m, "n": n, "k": k, "flops": flops,
                    "measured": tflops * 1e12 / peak,
                    "priced": predicted_share(profile, int(b * m), int(n), int(k),
                                              s["precision"]),
                    "curve_alone": curve})
    return out


TRAINING_GEMM_FLOPS = 1e11
TRAINING_GEMM_DIM = 1024
"""The GEMMs of a set that stand for a training block's (tokens x hidden x hidden or ffn): at
least this many FLOPs and every dimension at least this wide (no skinny output)."""


def fp8_matmul(s: dict[str, Any]) -> float:
    """The profile's Efficiency.fp8_matmul as FP8 set `s` measures it: the median, over its
    training-shaped GEMMs, of the measured share of the peak over the share the curve prices
    the GEMM at (the cost model's price with the profile's own figure divided back out)."""
    factor = load_profile(s["profile"]).efficiency.fp8_matmul
    ratios = [r["measured"] / (r["priced"] / factor) for r in compare(s)
              if r["flops"] >= TRAINING_GEMM_FLOPS
              and min(r["b"] * r["m"], r["n"], r["k"]) >= TRAINING_GEMM_DIM]
    if not ratios:
        raise ConfigError(f"{s['id']}.rows", "no GEMM of a training block's shape",
                          f"give GEMMs of {TRAINING_GEMM_FLOPS:.0e} FLOPs or more, every "
                          f"dimension at least {TRAINING_GEMM_DIM}")
    return float(np.median(ratios))


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """By FLOPs decade and in all: GEMMs, median measured and priced shares, and the priced over
    the measured time (median and 10th-90th percentiles), as priced and with the curve alone."""
    flops = np.array([r["flops"] for r in records])
    meas = np.array([r["measured"] for r in records])
    priced = np.array([r["priced"] for r in records])
    alone = np.array([r["curve_alone"] for r in records])

    def stats(sel: np.ndarray) -> dict[str, Any]:
        ratio, ratio_alone = meas[sel] / priced[sel], meas[sel] / alone[sel]
        return {"gemms": int(sel.sum()), "measured_share": float(np.median(meas[sel])),
                "priced_share": float(np.median(priced[sel])),
                "time_ratio": float(np.median(ratio)),
                "time_ratio_p10": float(np.percentile(ratio, 10)),
                "time_ratio_p90": float(np.percentile(ratio, 90)),
                "time_mape": float(np.mean(np.abs(ratio - 1.0))),
                "curve_alone_ratio": float(np.median(ratio_alone)),
                "curve_alone_mape": float(np.mean(np.abs(ratio_alone - 1.0)))}

    bins = []
    for lo, hi in zip(DECADES, DECADES[1:], strict=False):
        sel = (flops >= lo) & (flops < hi)
        if sel.any():
            bins.append({"from": lo, "to": hi, **stats(sel)})
    return {"bins": bins, "all": stats(np.ones_like(flops, dtype=bool))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--format", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    try:
        sets = load_sets(args.data)
    except ConfigError as err:
        print(f"gemm_published: {err}", file=sys.stderr)
        return 2
    report = [{"id": s["id"], "device": s["device"], "profile": s["profile"],
               "timing": " ".join(str(s.get("timing", "")).split()),
               **summarize(compare(s)),
               **({"fp8_matmul": fp8_matmul(s)} if s["precision"] == "fp8" else {})}
              for s in sets]
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return 0
    for r in report:
        print(f"\n{r['id']}: {r['device']}, priced on {r['profile']} ({r['timing']})")
        print(f"  {'FLOPs':>15} {'GEMMs':>6} {'measured':>9} {'priced':>7} "
              f"{'priced/measured time':>21} {'p10-p90':>11} {'curve alone':>12}")
        for b in [*r["bins"], {"from": None, **r["all"]}]:
            span = "all" if b["from"] is None else f"{b['from']:.0e}-{b['to']:.0e}"
            print(f"  {span:>15} {b['gemms']:>6} {b['measured_share']:>9.3f} "
                  f"{b['priced_share']:>7.3f} {b['time_ratio']:>21.2f} "
                  f"{b['time_ratio_p10']:>5.2f}-{b['time_ratio_p90']:<5.2f} "
                  f"{b['curve_alone_ratio']:>12.2f}")
        a = r["all"]
        print(f"  mean |priced/measured - 1|: {a['time_mape']:.1%} as priced, "
              f"{a['curve_alone_mape']:.1%} with the curve alone")
        if "fp8_matmul" in r:
            print(f"  fp8_matmul measured: {r['fp8_matmul']:.3f} (median over the GEMMs of "
                  f">= {TRAINING_GEMM_FLOPS:.0e} FLOPs, every dimension >= {TRAINING_GEMM_DIM}; "
                  f"the {r['profile']} profile files "
                  f"{load_profile(r['profile']).efficiency.fp8_matmul:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
