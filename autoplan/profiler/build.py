"""Turn measurements into a profile: the same schema as the datasheet profiles, with efficiency
curves replaced by measured ones and the raw tables kept under `measured`."""

from __future__ import annotations

import copy
import datetime
import platform
from typing import Any

import numpy as np
import torch

from autoplan.profiler.compute import Timing

MIN_EFF = 0.005


def _clamp(v: float) -> float:
    return float(min(1.0, max(MIN_EFF, v)))


def matmul_curve(timings: list[Timing], peak: float) -> dict[str, list[float]]:
    """Efficiency = achieved FLOP/s / peak at each measured GEMM size."""
    return {"x": [t.size for t in timings], "y": [_clamp(t.size / t.seconds / peak) for t in timings]}


def link_from_all_reduce(rows: list[list[float]], group: int
                         ) -> tuple[float, float, dict[str, list[float]]]:
    """(bandwidth bytes/s, latency s, efficiency curve) for the cost model's ring formula
    t = 2(n-1) * latency + 2(n-1)/n * bytes / (bandwidth * efficiency(bytes)).

    A least-squares line t = a + c * bytes over all sizes gives the latency (a / steps) and the
    bandwidth (factor / c); the curve is what each size achieved against that bandwidth."""
    steps, factor = 2.0 * (group - 1), 2.0 * (group - 1) / group
    xs = np.array([r[0] for r in rows])
    ts = np.array([r[1] for r in rows])
    slope, intercept = np.polyfit(xs, ts, 1)
    intercept = max(float(intercept), float(ts.min()) * 0.5, 1e-7)
    slope = max(float(slope), 1e-15)
    bandwidth = factor / slope
    achieved = factor * xs / np.maximum(ts - intercept, 1e-9)
    curve = {"x": [float(x) for x in xs], "y": [_clamp(a / bandwidth) for a in achieved]}
    return float(bandwidth), intercept / steps, curve


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
) -> dict[str, Any]:
    """The profile: `base` with the measured fields replaced; `layers` (optional) holds the
    per-layer tables (layer_models, layers, saved_activations) kept under `measured`."""
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
    eff["memory_bound"] = _clamp(elementwise_bw / copy_bw)
    eff["op_overhead_s"] = float(op_overhead_s)
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
    prof["measured"] = {
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
    }
    if layers and layers.get("layers"):
        _feed_layer_points(prof, layers, precision)
    return prof


def _feed_layer_points(prof: dict[str, Any], layers: dict[str, Any], precision: str) -> None:
    """Put the runtime's MLP GEMM efficiencies on the matmul curve when that brings the
    predicted block times (rows the points were not taken from) closer to the measured ones;
    record the points, the verdict and both errors under measured.matmul_from_layers."""
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
