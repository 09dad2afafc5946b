"""The cost model's figures for the shapes the profiler measured, evaluated with the profile
just measured: per-layer forward + backward seconds and bytes kept for backward.

The model prices a whole block (autoplan.cost.compute.layer_times_s) and the output layer
(logits_times_s); for the block's parts we take its own terms apart: each part's GEMMs, the
attention core, and the element-wise time of the activation bytes that part owns. The per-op
dispatch charge and the embedding are only in the block and nowhere, respectively.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoplan.cost import activations, compute, elementwise, params
from autoplan.cost.block_time import block_times_s
from autoplan.cost.runtimes import RuntimeTraits, load_runtime
from autoplan.cost.step_time import priced_profile
from autoplan.hardware import ClusterProfile
from autoplan.model_spec import MlpKind, ModelSpec

RC = {"none": 0, "selective": 1, "full": 2}


def model_spec(raw: dict[str, Any], seq: int) -> ModelSpec:
    from autoplan.yaml_io import from_dict

    return from_dict(ModelSpec, raw, "measured.layer_models").replace(seq_len=seq)


def _runtime(profile: ClusterProfile | None) -> RuntimeTraits:
    """The profiler measures autoplan's own runtime on this machine (CPU without a profile)."""
    return load_runtime(None, on_cpu=profile is None or profile.is_cpu)


def _parts(spec: ModelSpec, b: int, tp: int, runtime: RuntimeTraits) -> dict[str, np.ndarray]:
    return activations.activation_elements_per_layer(
        spec, np.array(b), np.array(tp), np.array(False), np.array(1), eager_attention=False,
        fused_norm=runtime.fused_norm, fused_swiglu=runtime.fused_swiglu)


def predicted_layer_s(layer: str, spec: ModelSpec, b: int, tp: int, profile: ClusterProfile,
                      precision: str) -> float | None:
    """The cost model's forward + backward seconds of one tp shard of `layer` for one
    micro-batch of b sequences of spec.seq_len tokens; None where it charges nothing."""
    peak = profile.device.peak(precision)
    scale = 2.0 if precision == "fp32" else 1.0
    ba, ta, one = np.array(float(b)), np.array(float(tp)), np.array(1.0)
    runtime = _runtime(profile)
    parts = _parts(spec, b, tp, runtime)
    s = spec.seq_len
    if layer == "logits":
        vocab = params.padded_vocab(spec, tp).astype(float)
        return float(compute.logits_times_s(spec, profile, peak, ba, ta, one, vocab,
                                            runtime.loss_bytes(precision)))
    lt = block_times_s(spec, priced_profile(profile, runtime), precision, ba, ta, one, False,
                       runtime, parts)
    if layer == "block":  # DTensor's host costs apart on a CPU, folded in on CUDA
        return float(lt["forward"] + lt["backward"] + lt["dtensor"])
    gemms = compute.gemm_flops_per_layer(spec, ba * s, ta)
    gemm_s = [float(compute.gemm_time_s(g, profile, peak)) for g in gemms]
    # 16-bit bytes each part keeps (activations.py's terms), moved ELEMENTWISE_PASSES times
    owned = {
        "attention": float(parts["qkv"] + parts["attn_out"]),
        "mlp": float(parts["mlp_act"] + parts["mlp_mid"]),
        "norm": float(parts["norm"] + parts["gemm_in"]) / 2.0,  # one norm's input and output
    }
    if layer not in owned:
        return None
    elem = float(compute.memory_time_s(owned[layer] * scale * elementwise.ELEMENTWISE_PASSES,
                                       profile))
    if layer == "attention":
        core = float(lt["core_forward"] + lt["core_backward"])  # each at its own efficiency
        return 3.0 * (gemm_s[0] + gemm_s[1]) + core + elem
    if layer == "mlp":
        return 3.0 * (gemm_s[2] + gemm_s[3]) + elem
    return elem


def predicted_saved_bytes(spec: ModelSpec, b: int, tp: int, policy: str, precision: str,
                          profile: ClusterProfile | None = None) -> float:
    """activations.activation_bytes_per_layer for one block (flash attention, no SP, no CP) as
    autoplan's runtime on this machine keeps it."""
    runtime = _runtime(profile)
    return float(activations.activation_bytes_per_layer(
        _parts(spec, b, tp, runtime), np.array(RC[policy]), precision, runtime.selective.value))


def layer_comparison(layers: dict[str, Any], models: dict[str, Any], profile: ClusterProfile,
                     precision: str) -> list[dict[str, Any]]:
    """One entry per (model, layer): how the measured fwd+bwd time compares with the model's
    over every measured shape (median and range of measured / predicted), and the figures at
    the largest shape."""
    cols = layers["columns"]
    groups: dict[tuple[str, str], list[tuple[float, float | None, dict[str, Any]]]] = {}
    for raw in layers["rows"]:
        r = dict(zip(cols, raw, strict=True))
        spec = model_spec(models[r["model"]], r["seq"])
        pred = predicted_layer_s(r["layer"], spec, r["mbs"], r["tp"], profile, precision)
        groups.setdefault((r["model"], r["layer"]), []).append((r["fwd_s"] + r["bwd_s"], pred, r))
    out = []
    for (fam, layer), items in groups.items():
        meas, pred, r = max(items, key=lambda it: it[2]["mbs"] * it[2]["seq"] / it[2]["tp"])
        ratios = [m / p for m, p, _ in items if p]
        out.append({
            "model": fam, "layer": layer, "shapes": len(items),
            "largest": f"{r['mbs']}x{r['seq']} tp{r['tp']}", "measured_s": meas,
            "predicted_s": pred,
            "ratio_median": float(np.median(ratios)) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
        })
    return out


def saved_comparison(saved: dict[str, Any], models: dict[str, Any], precision: str
                     ) -> list[dict[str, Any]]:
    """measured vs activations.py bytes per block for every measured (model, tp, policy)."""
    cols = saved["columns"]
    out = []
    for raw in saved["rows"]:
        r = dict(zip(cols, raw, strict=True))
        spec = model_spec(models[r["model"]], r["seq"])
        pred = predicted_saved_bytes(spec, r["mbs"], r["tp"], r["policy"], precision)
        out.append({**r, "predicted": pred, "ratio": r["bytes"] / pred})
    return out


MIN_GEMM_SHARE = 0.5
"""Rows whose GEMMs take less than this share of the measured time say little about them."""


def mlp_gemm_points(layers: dict[str, Any], models: dict[str, Any], profile: ClusterProfile,
                    precision: str) -> list[list[float]]:
    """[[FLOPs of one GEMM, efficiency]] of the runtime's GELU MLP shards: its two GEMMs have
    equal FLOPs (2*tokens*h*f/tp each); their seconds are the measured fwd+bwd minus what the
    model already charges the MLP apart from GEMMs (element-wise bytes x ELEMENTWISE_PASSES and
    its aten ops x op_overhead_s), so the curve takes no time the model counts elsewhere.
    The median over shapes with the same FLOPs."""
    cols = layers["columns"]
    peak = profile.device.peak(precision)
    scale = 2.0 if precision == "fp32" else 1.0
    runtime = _runtime(profile)
    by_size: dict[float, list[float]] = {}
    for raw in layers["rows"]:
        r = dict(zip(cols, raw, strict=True))
        spec = model_spec(models[r["model"]], r["seq"])
        if r["layer"] != "mlp" or spec.mlp is not MlpKind.GELU:
            continue
        tokens, f = r["mbs"] * r["seq"], spec.ffn / r["tp"]
        elem = float(compute.memory_time_s(
            4.0 * tokens * f * scale * elementwise.ELEMENTWISE_PASSES, profile))
        total = r["fwd_s"] + r["bwd_s"]
        # a host that runs ahead (CUDA) hides its op costs behind these GEMMs; a CPU pays them
        host = 0.0 if runtime.host_runs_ahead else r["ops"] * profile.efficiency.op_overhead_s
        gemm_s = total - elem - host
        if gemm_s < MIN_GEMM_SHARE * total:
            continue
        flops = 2.0 * tokens * spec.hidden_size * f
        by_size.setdefault(flops, []).append(3.0 * 2.0 * flops / (peak * gemm_s))
    return [[x, float(np.median(by_size[x]))] for x in sorted(by_size)]


def layer_error(layers: dict[str, Any], models: dict[str, Any], profile: ClusterProfile,
                precision: str, layer: str = "block") -> float | None:
    """Mean |log(measured / predicted)| of fwd+bwd time over the rows of `layer`."""
    cols = layers["columns"]
    errs = []
    for raw in layers["rows"]:
        r = dict(zip(cols, raw, strict=True))
        if r["layer"] != layer:
            continue
        spec = model_spec(models[r["model"]], r["seq"])
        pred = predicted_layer_s(layer, spec, r["mbs"], r["tp"], profile, precision)
        if pred:
            errs.append(abs(np.log((r["fwd_s"] + r["bwd_s"]) / pred)))
    return float(np.mean(errs)) if errs else None
