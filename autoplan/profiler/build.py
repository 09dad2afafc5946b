"""Turn measurements into a profile: the same schema as the datasheet profiles, with efficiency
curves replaced by measured ones and the raw tables kept under `measured`."""

from __future__ import annotations

import copy
import datetime
import platform
from typing import Any

import numpy as np
import torch

from autoplan.errors import RuntimeLaunchError
from autoplan.hardware_efficiency import MAX_FP8_MATMUL
from autoplan.profiler.collectives import monotone
from autoplan.profiler.compute import Timing

MIN_EFF = 0.005


def _clamp(v: float) -> float:
    return float(min(1.0, max(MIN_EFF, v)))


def matmul_curve(timings: list[Timing], peak: float) -> dict[str, list[float]]:
    """Efficiency = achieved FLOP/s / peak at each measured GEMM size."""
    return {"x": [t.size for t in timings], "y": [_clamp(t.size / t.seconds / peak) for t in timings]}


FP8_FORWARD_SHARE = 1.0 / 3.0
"""A layer's GEMM FLOPs in its forward (fprop) against its backward (dgrad and wgrad, each the
forward's): a third."""


def fp8_matmul_ratio(fp8: dict[str, list[Timing]], matmul: list[Timing], peak_fp8: float,
                     peak: float) -> tuple[float, dict[str, float]]:
    """Efficiency.fp8_matmul as this GPU measures it, and each pass's figure. A pass's: the
    median, over the sizes timed in FP8 with its accumulation (compute.FP8_FAST_ACCUM), of an
    FP8 GEMM's share of the fp8 peak over the share the curve's GEMM of the same size (timed
    in the curve's dtype) reached of its peak, as benchmarks/gemm_published.py reads published
    cuBLASLt tables. The profile's: the rate of a layer's GEMMs, a third forward and two thirds
    backward (FP8_FORWARD_SHARE): 1 / (1/3 / forward + 2/3 / backward)."""
    curve = {t.size: t.seconds for t in matmul}
    by_pass = {}
    for part, timings in fp8.items():
        ratios = [(t.size / t.seconds / peak_fp8) / (t.size / curve[t.size] / peak)
                  for t in timings if t.size in curve]
        if not ratios:
            raise RuntimeLaunchError(
                f"FP8 GEMMs timed at sizes {[t.size for t in timings]}, none of which the "
                f"matmul curve measured {sorted(curve)}")
        by_pass[part] = float(np.median(ratios))
    share = {"forward": FP8_FORWARD_SHARE, "backward": 1.0 - FP8_FORWARD_SHARE}
    weights = sum(share[p] for p in by_pass)  # 1 with both passes timed
    return weights / sum(share[p] / r for p, r in by_pass.items()), by_pass


def clean_all_reduce_rows(rows: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, seconds) of the measured all-reduce rows, cleaned as the profile's `collectives`
    table is (collectives.collective_tables): rows without a positive, finite size and time are
    dropped, repeats of one size give their median (collectives.py already sends one median of
    its repeats per size), and each time is the least of it and every larger size's, so a slow
    small-message sample (a warm-up, a rank that lost its core) prices nothing."""
    by_size: dict[float, list[float]] = {}
    for nbytes, seconds in rows:
        if np.isfinite(nbytes) and np.isfinite(seconds) and nbytes > 0 and seconds > 0:
            by_size.setdefault(float(nbytes), []).append(float(seconds))
    if not by_size:
        raise RuntimeLaunchError(f"the collective benchmark gave no all-reduce time above 0 "
                                 f"(rows {rows})")
    xs = sorted(by_size)
    return np.array(xs), np.array(monotone([float(np.median(by_size[x])) for x in xs]))


def isotonic(values: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest `values` in squared error (pool adjacent violators:
    a value below the one before it is averaged with it, and so on back)."""
    blocks: list[tuple[float, int]] = []  # (mean, count)
    for v in values:
        mean, count = float(v), 1
        while blocks and blocks[-1][0] > mean:
            prev, n = blocks.pop()
            mean, count = (prev * n + mean * count) / (n + count), n + count
        blocks.append((mean, count))
    return np.repeat([m for m, _ in blocks], [n for _, n in blocks])


LATENCY_SHARE = 0.5
"""Share of the smallest message's time put on the latency term, the rest on the curve."""


def link_from_all_reduce(rows: list[list[float]], group: int
                         ) -> tuple[float, float, dict[str, list[float]]]:
    """(bandwidth bytes/s, latency s, efficiency curve) that put back into the cost model's
    ring formula (cost.comm.collective_time_s inside a node)
        t(M) = 2(n-1) * latency + 2(n-1)/n * M / (bandwidth * efficiency(M))
    give each measured size its cleaned time (clean_all_reduce_rows).

    - latency: one group size cannot tell the fixed cost from a slow small message (any split
      reproduces it), so LATENCY_SHARE of the smallest size's time is the 2(n-1) steps'
      latency; t - that is then positive at every size.
    - achieved bandwidth at each size: 2(n-1)/n * M / (t(M) - 2(n-1) * latency).
    - the curve must not fall with size (hardware.Curve interpolates it as a monotone table):
      the isotonic fit of log achieved bandwidth. Where the measured one already rises with size
      it is unchanged and every size is reproduced exactly; where it falls (a message that
      leaves the cache runs slower per byte, seen at 4-64 MiB on CPU hosts) the sizes involved
      share their geometric mean, which stays within the measurement's own spread.
    - bandwidth: the fit's largest value, so the curve lies in (0, 1] with 1 at its top; no
      clamp is needed, which would move a size's time off its measurement."""
    steps, factor = 2.0 * (group - 1), 2.0 * (group - 1) / group
    xs, ts = clean_all_reduce_rows(rows)
    fixed = LATENCY_SHARE * float(ts[0])  # 2(n-1) * latency
    log_achieved = isotonic(np.log(factor * xs / (ts - fixed)))
    top = float(log_achieved[-1])
    curve = {"x": [float(x) for x in xs], "y": [float(np.exp(v - top)) for v in log_achieved]}
    return float(np.exp(top)), fixed / steps, curve


def with_layer_points(curve: dict[str, list[float]], points: list[list[float]]
                      ) -> dict[str, list[float]]:
    """The matmul curve with the square-GEMM points inside the span of `points` (measured on
    the runtime's own MLP GEMMs, see compare.mlp_gemm_points) replaced by them: inside that
    span the layers' shapes are what the cost model prices; outside it the square GEMMs stay."""
    if not points:
        return curve
    lo, hi = points[0][0], points[-1][0]
    merged = [(x, y) for x, y in zip(curve["x"], curve["y"], strict=True) if not lo <= x <= hi]
    merged = sorted(merged + [(x, _clamp(y)) for x, y in points])
    return {"x": [x for x, _ in merged], "y": [y for _, y in merged]}


def assemble(
    base: dict[str, Any], name: str, device: torch.device, precision: str,
    matmul: list[Timing], copy_bw: float, elementwise_bw: float, op_overhead_s: float,
    collectives: dict[int, dict[str, list[list[float]]]], host_copy_bw: float,
    adam_params_per_s: float, quick: bool, layers: dict[str, Any] | None = None,
    fp8: dict[str, list[Timing]] | None = None,
) -> dict[str, Any]:
    """The profile: `base` with the measured fields replaced; `layers` (optional) holds the
    per-layer tables (layer_models, layers, saved_activations) kept under `measured`; `fp8`
    (optional) the FP8 GEMMs timed at the curve's training sizes, by pass, which set
    efficiency.fp8_matmul (fp8_matmul_ratio) where the figure lies in the range a profile
    loads (hardware_efficiency.MAX_FP8_MATMUL; outside it the base's stays, and the timings
    say why). The caller applies what else it measured (dispatch, precision, collective
    tables), then feed_layer_points, which prices the layers with every field final."""
    prof = copy.deepcopy(base)
    prof["schema_version"] = 1
    prof["name"] = name
    dev = prof["device"]
    if device.type == "cpu":
        best = max(t.size / t.seconds for t in matmul)
        dev["name"] = f"cpu-1-thread ({platform.processor() or platform.machine()})"
        dev["peak_flops_per_s"] = {**dev.get("peak_flops_per_s", {}), precision: best}
        peak = best
    else:
        dev["name"] = torch.cuda.get_device_name(device)
        dev["memory_bytes"] = int(torch.cuda.get_device_properties(device).total_memory)
        peak = float(dev["peak_flops_per_s"][precision])
    dev["hbm_bytes_per_s"] = float(copy_bw)
    eff = prof["efficiency"]
    eff["matmul"] = matmul_curve(matmul, peak)
    # the GEMMs just timed on one GPU ran at its burst clock, as the papers' attention figures
    # the base keeps did: both are read at the same clock (Efficiency.attention_clock)
    eff["attention_clock"] = 1.0
    eff["memory_bound"] = _clamp(elementwise_bw / copy_bw)
    eff["op_overhead_s"] = float(op_overhead_s)
    fp8_record = None
    if fp8:
        ratio, by_pass = fp8_matmul_ratio(fp8, matmul, float(dev["peak_flops_per_s"]["fp8"]),
                                          peak)
        applied = 0.0 < ratio <= MAX_FP8_MATMUL
        if applied:
            eff["fp8_matmul"] = ratio
        fp8_record = {**{f"{p}_gemms": [[t.size, t.seconds] for t in ts] for p, ts in fp8.items()},
                      **{f"{p}_ratio": r for p, r in by_pass.items()},
                      "ratio": ratio, "applied": applied}
    if collectives:
        # the smallest group: larger ones on a CPU host are slowed by ranks sharing cores,
        # which the cost model accounts for separately (host.compute_slots)
        group = min(collectives)
        bw, lat, curve = link_from_all_reduce(collectives[group]["all_reduce"], group)
        prof["intra_node"] = {"bytes_per_s": float(bw), "latency_s": float(lat)}
        eff["intra_node"] = curve
        if device.type == "cpu":  # one host: there is no other tier to measure
            prof["inter_node"] = dict(prof["intra_node"])
            eff["inter_node"] = copy.deepcopy(curve)
    prof["host"]["pcie_bytes_per_s"] = float(host_copy_bw)
    prof["host"]["optimizer_params_per_s"] = float(adam_params_per_s)
    if device.type == "cpu":
        import os

        prof["host"]["compute_slots"] = len(os.sched_getaffinity(0))
    prof["description"] = (f"Measured by `autoplan profile{' --quick' if quick else ''}` on "
                           f"{platform.node()} ({dev['name']}); fields not measured come from "
                           f"the base profile {base.get('name')!r}.")
    prof["measured"] = {  # profile_measured.MEASURED_KEYS: a profile that lacks one is refused
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": str(torch.__version__), "device": dev["name"], "precision": precision,
        "quick": quick, "threads_per_rank": 1 if device.type == "cpu" else None,
        "matmul": [[t.size, t.seconds] for t in matmul],
        "copy_bytes_per_s": float(copy_bw), "elementwise_bytes_per_s": float(elementwise_bw),
        "op_overhead_s": float(op_overhead_s),
        "collectives": {str(g): ops for g, ops in collectives.items()},
        "host_copy_bytes_per_s": float(host_copy_bw),
        "cpu_adam_params_per_s": float(adam_params_per_s),
        **(layers or {}),
        **({"fp8_matmul": fp8_record} if fp8_record else {}),
    }
    return prof


def feed_layer_points(prof: dict[str, Any], layers: dict[str, Any], precision: str) -> None:
    """Put the runtime's MLP GEMM efficiencies on the matmul curve when that brings the
    predicted block times (rows the points were not taken from) closer to the measured ones;
    record the points, the verdict and both errors under measured.matmul_from_layers.

    The verdict prices blocks with the whole profile (per-op dispatch costs, attention figures,
    16-bit peaks), so it is made last, once every measured field is in `prof`."""
    from autoplan.hardware import profile_from_dict
    from autoplan.profiler.compare import layer_error, mlp_gemm_points

    eff, tables, models = prof["efficiency"], layers["layers"], layers["layer_models"]
    square = profile_from_dict(prof)
    points = mlp_gemm_points(tables, models, square, precision)
    curve = with_layer_points(eff["matmul"], points)
    fed = profile_from_dict(prof | {"efficiency": eff | {"matmul": curve}})
    before = layer_error(tables, models, square, precision)
    after = layer_error(tables, models, fed, precision)
    used = bool(points) and before is not None and after is not None and after <= before
    if used:
        eff["matmul"] = curve
    prof["measured"]["matmul_from_layers"] = {
        "points": points, "used": used,
        "block_log_error": {"square_gemms": before, "with_points": after}}
