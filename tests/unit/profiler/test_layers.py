"""Per-layer timing table of the runtime's layers, and how it feeds the matmul curve."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autoplan.hardware import load_profile
from autoplan.profiler.build import with_layer_points
from autoplan.profiler.compare import (
    layer_comparison,
    mlp_gemm_points,
    predicted_layer_s,
)
from autoplan.profiler.layers import (
    COLUMNS,
    LAYERS,
    LayerGrid,
    build_layer,
    layer_models,
    layer_rows,
)
from autoplan.yaml_io import to_dict

CPU = torch.device("cpu")
GRID = LayerGrid(mbs=(1,), seq=(16,), tp=(1, 2), repeats=1, warmup=0)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [dict(zip(COLUMNS, r, strict=True)) for r in layer_rows(GRID, CPU, "fp32")]


def test_table_has_every_layer_family_and_shape(rows) -> None:
    expected = {(layer, fam, t) for fam in ("gpt", "llama") for layer in LAYERS
                for t in GRID.tp if not (layer == "norm" and t > 1)}
    assert {(r["layer"], r["model"], r["tp"]) for r in rows} == expected
    assert len(rows) == len(expected)
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 for r in rows)
    assert all(r["mbs"] == 1 and r["seq"] == 16 for r in rows)
    assert all(r["ops"] > 0 for r in rows)
    ops = {(r["layer"], r["model"]): r["ops"] for r in rows if r["tp"] == 1}
    assert ops[("mlp", "llama")] > ops[("mlp", "gpt")]  # SwiGLU: a third GEMM, silu * up


def test_tp_shard_does_a_tp_th_of_the_flops(rows) -> None:
    flops = {(r["layer"], r["model"], r["tp"]): r["flops"] for r in rows}
    for layer in ("attention", "mlp", "logits", "block"):
        for fam in ("gpt", "llama"):
            assert flops[(layer, fam, 1)] > 0
            assert flops[(layer, fam, 1)] == pytest.approx(2 * flops[(layer, fam, 2)])


def test_shards_follow_the_runtime_tp_plan() -> None:
    spec = layer_models(CPU, 16)["llama"]
    block = build_layer("block", spec, 2, CPU, torch.float32)
    h, d = spec.hidden_size, spec.head_dim
    assert block.attention.wq.weight.shape == (spec.num_heads * d // 2, h)   # column-parallel
    assert block.attention.wk.weight.shape == (spec.kv_heads * d // 2, h)
    assert block.attention.wo.weight.shape == (h, spec.num_heads * d // 2)   # row-parallel
    assert block.feed_forward.w2.weight.shape == (h, spec.ffn // 2)
    emb = build_layer("embedding", spec, 2, CPU, torch.float32)
    assert emb.tok.weight.shape == (spec.vocab_size // 2, h)                 # vocab-parallel


def test_mlp_points_recover_the_curve_the_times_were_made_with() -> None:
    """Times built from the model's own terms give back its GEMM efficiency: nothing the model
    charges elsewhere (element-wise bytes, per-op dispatch) leaks into the curve."""
    prof = load_profile("cpu-gloo")
    spec = layer_models(CPU, 128)["gpt"]
    models = {k: to_dict(v) for k, v in layer_models(CPU, 128).items()}
    table = {"columns": list(COLUMNS), "rows": []}
    ops = 20
    for b, tp in ((1, 1), (4, 1), (4, 2)):
        t = predicted_layer_s("mlp", spec, b, tp, prof, "fp32") + ops * prof.efficiency.op_overhead_s
        table["rows"].append(["mlp", "gpt", b, 128, tp, spec.hidden_size, t / 3, 2 * t / 3, 0.0,
                              ops])
    points = mlp_gemm_points(table, models, prof, "fp32")
    assert len(points) == 3
    for x, y in points:
        assert y == pytest.approx(float(prof.efficiency.matmul(x)), rel=1e-9)
    assert [x for x, _ in points] == sorted(2.0 * b * 128 * 256 * 1024 / tp
                                            for b, tp in ((1, 1), (4, 1), (4, 2)))


def test_layer_points_replace_square_points_only_inside_their_span() -> None:
    curve = {"x": [1e3, 1e6, 1e8, 1e10], "y": [0.1, 0.5, 0.9, 1.0]}
    merged = with_layer_points(curve, [[1e5, 0.4], [1e8, 0.8], [1e9, 0.85]])
    assert merged == {"x": [1e3, 1e5, 1e8, 1e9, 1e10], "y": [0.1, 0.4, 0.8, 0.85, 1.0]}
    assert with_layer_points(curve, []) == curve


def test_comparison_names_every_model_and_layer(rows) -> None:
    prof = load_profile("cpu-gloo")
    models = {k: to_dict(v) for k, v in layer_models(CPU, 16).items()}
    table = {"columns": list(COLUMNS), "rows": [[r[c] for c in COLUMNS] for r in rows]}
    out = layer_comparison(table, models, prof, "fp32")
    assert {(o["model"], o["layer"]) for o in out} == {
        (f, layer) for f in ("gpt", "llama") for layer in LAYERS}
    for o in out:
        if o["layer"] == "embedding":  # the cost model charges no embedding time
            assert o["predicted_s"] is None and o["ratio_median"] is None
        else:
            assert o["predicted_s"] > 0 and np.isfinite(o["ratio_median"])


def test_block_prediction_is_the_estimate_term() -> None:
    """The block row is priced with block_time.block_times_s exactly as estimate_table charges a
    block (forward + backward + DTensor's host costs, apart on a CPU)."""
    from autoplan.cost import activations
    from autoplan.cost.block_time import block_times_s
    from autoplan.cost.runtimes import load_runtime
    from autoplan.cost.step_time import priced_profile
    prof = load_profile("cpu-gloo")
    runtime = load_runtime("autoplan-cpu")
    spec = layer_models(CPU, 128)["gpt"]
    parts = activations.activation_elements_per_layer(spec, np.array(2), np.array(2),
                                                      np.array(False), np.array(1), False,
                                                      fused_norm=False, fused_swiglu=False)
    lt = block_times_s(spec, priced_profile(prof, runtime), "fp32", np.array(2.0),
                       np.array(2.0), np.array(1.0), False, runtime, parts)
    assert predicted_layer_s("block", spec, 2, 2, prof, "fp32") == pytest.approx(
        float(lt["forward"] + lt["backward"] + lt["dtensor"]))
    assert lt["dtensor"] > 0  # tp 2 on a CPU


def test_attention_is_priced_with_the_profiles_backward_figure() -> None:
    """The attention layer's prediction prices its core's backward at the profile's backward
    efficiency (the block's core_backward), not at the forward's: the profiler measures them
    apart, so a slower backward figure must make the layer slower."""
    import dataclasses

    prof = load_profile("cpu-gloo")
    spec = layer_models(CPU, 128)["gpt"]
    eff = prof.efficiency
    halved = {k: v.scaled(0.5) if hasattr(v, "scaled") else v * 0.5
              for k, v in (eff.attention_backward or {}).items()}
    assert halved, "cpu-gloo files backward attention figures"
    slower = dataclasses.replace(prof, efficiency=dataclasses.replace(
        eff, attention_backward=halved))
    assert (predicted_layer_s("attention", spec, 2, 1, slower, "fp32")
            > predicted_layer_s("attention", spec, 2, 1, prof, "fp32"))
