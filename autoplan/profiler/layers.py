"""Forward and backward seconds of the runtime's own layers (attention, MLP, norm, embedding,
logits + loss, the whole block) over micro-batch x sequence x tp-shard sizes, on one device.

A tp shard is the layer with its column-parallel outputs and row-parallel inputs divided by tp,
exactly as autoplan.runtime.tensor_parallel lays the weights out; it runs without a process
group, so the time of the TP collectives is not in these figures (the link fit prices them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.model_spec import MlpKind, ModelSpec, NormKind, PositionKind
from autoplan.profiler.compute import DTYPES
from autoplan.runtime.models.layers import Attention, FeedForward, make_norm
from autoplan.runtime.models.transformer import Block, Embedding
from autoplan.runtime.parallelize import cross_entropy
from autoplan.runtime.tensor_parallel import block_plan, head_plan
from autoplan.yaml_io import to_dict

LAYERS = ("attention", "mlp", "norm", "embedding", "logits", "block")
COLUMNS = ("layer", "model", "mbs", "seq", "tp", "hidden", "fwd_s", "bwd_s", "flops", "ops")
"""One row of `measured.layers.rows`; flops are forward FLOPs as torch's FlopCounterMode counts
them (GEMMs and the full s x s attention square), ops the aten operators forward + backward
dispatch (what the cost model's op_overhead_s is charged per)."""
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class LayerGrid:
    """The shapes `autoplan profile` times: every micro-batch x sequence x tp combination."""

    mbs: tuple[int, ...]
    seq: tuple[int, ...]
    tp: tuple[int, ...]
    repeats: int
    """Timed calls per shape; the median is kept."""
    warmup: int = 1


def layer_grid(device: torch.device, quick: bool) -> LayerGrid:
    if device.type == "cuda":
        if quick:
            return LayerGrid((1, 2), (1024, 4096), (1, 4), repeats=5, warmup=2)
        return LayerGrid((1, 2, 4), (1024, 2048, 4096), (1, 2, 4, 8), repeats=10, warmup=3)
    if quick:
        return LayerGrid((1, 4), (128, 256), (1, 2), repeats=3)
    return LayerGrid((1, 2, 4), (128, 256, 512), (1, 2, 4), repeats=5, warmup=2)


def layer_models(device: torch.device, seq_len: int) -> dict[str, ModelSpec]:
    """The two families the runtime builds, at a width that suits the device: GPT (LayerNorm,
    GELU, learned positions, biases) and Llama (RMSNorm, SwiGLU, RoPE, grouped-query)."""
    if device.type == "cuda":  # gpt3-6.7b and llama-3-8b widths
        h, heads, kv, ffn_llama, vocab = 4096, 32, 8, 14336, 50304
    else:
        h, heads, kv, ffn_llama, vocab = 256, 4, 2, 704, 4096
    gpt = ModelSpec(name="gpt", num_layers=1, hidden_size=h, num_heads=heads, vocab_size=vocab,
                    seq_len=seq_len)
    llama = gpt.replace(name="llama", num_kv_heads=kv, ffn_hidden_size=ffn_llama,
                        mlp=MlpKind.SWIGLU, norm=NormKind.RMSNORM, position=PositionKind.ROPE,
                        bias=False)
    return {"gpt": gpt, "llama": llama}


def shard_for_tp(module: nn.Module, styles: dict[str, object], tp: int) -> None:
    """Give a meta-device `module` the local parameter shapes of one tp rank: column-parallel
    weights (and biases) keep 1/tp of their rows, row-parallel ones 1/tp of their inputs
    (an Embedding's rows), as parallelize_module would shard them."""
    if tp == 1:
        return
    for fqn, style in styles.items():
        if not isinstance(style, ColwiseParallel | RowwiseParallel):
            continue
        sub = module.get_submodule(fqn)
        row = isinstance(style, RowwiseParallel)
        for name, p in list(sub.named_parameters(recurse=False)):
            if row and name == "bias":
                continue  # added once after the reduction: replicated
            dim = 1 if row and isinstance(sub, nn.Linear) else 0
            shape = list(p.shape)
            if shape[dim] % tp:
                raise ValueError(f"{fqn}.{name}: dim {dim} of {shape} does not split by {tp}")
            shape[dim] //= tp
            setattr(sub, name, nn.Parameter(torch.empty(shape, device="meta", dtype=p.dtype)))


def _materialize(module: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    module.to_empty(device=device)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or isinstance(module, nn.LayerNorm | nn.RMSNorm):
                p.fill_(0.0 if name.endswith("bias") else 1.0)
            else:
                p.normal_(0.0, 0.02)
    return module.to(dtype)


def _within(styles: dict[str, object], prefix: str) -> dict[str, object]:
    return {k[len(prefix) + 1:]: v for k, v in styles.items() if k.startswith(prefix + ".")}


def build_layer(layer: str, spec: ModelSpec, tp: int, device: torch.device,
                dtype: torch.dtype) -> nn.Module:
    """One tp rank's shard of a runtime layer, materialised with small random weights."""
    styles = block_plan(False, spec.mlp is MlpKind.SWIGLU)
    with torch.device("meta"):
        if layer == "attention":
            mod: nn.Module = Attention(spec)
            shard_for_tp(mod, _within(styles, "attention"), tp)
        elif layer == "mlp":
            mod = FeedForward(spec)
            shard_for_tp(mod, _within(styles, "feed_forward"), tp)
        elif layer == "norm":
            mod = make_norm(spec)
        elif layer == "embedding":
            mod = Embedding(spec)
            shard_for_tp(mod, _within(head_plan(False, True, True, False), "embed"), tp)
        elif layer == "logits":
            mod = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)  # Transformer.output
            shard_for_tp(mod, {"": head_plan(False, True, False, True)["output"]}, tp)
        elif layer == "block":
            mod = Block(spec)
            shard_for_tp(mod, styles, tp)
        else:
            raise ValueError(f"unknown layer {layer!r}; expected one of {', '.join(LAYERS)}")
    return _materialize(mod, device, dtype)


def _forward_fn(layer: str, mod: nn.Module, spec: ModelSpec, mbs: int, seq: int, tp: int,
                device: torch.device, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    if layer == "embedding":
        tokens = torch.randint(0, spec.vocab_size // tp, (mbs, seq), device=device)
        return lambda: mod(tokens)
    x = torch.randn(mbs, seq, spec.hidden_size, device=device, dtype=dtype, requires_grad=True)
    if layer == "logits":
        labels = torch.randint(0, spec.vocab_size // tp, (mbs, seq), device=device)
        return lambda: cross_entropy(mod(x), labels)
    return lambda: mod(x)


def _now(device: torch.device) -> object:
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def _elapsed(start: object, end: object, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
    return float(end) - float(start)  # type: ignore[arg-type]


def time_forward_backward(fwd: Callable[[], torch.Tensor], device: torch.device, repeats: int,
                          warmup: int = 1) -> tuple[float, float]:
    """Median seconds of a forward and of the backward of its output (a fresh graph each
    time; parameter gradients accumulate, as over micro-batches)."""
    out = fwd()
    grad = torch.randn_like(out) if out.dim() else None
    fw, bw = [], []
    for i in range(warmup + repeats):
        t0 = _now(device)
        out = fwd()
        t1 = _now(device)
        out.backward(grad)
        t2 = _now(device)
        if i >= warmup:
            fw.append(_elapsed(t0, t1, device))
            bw.append(_elapsed(t1, t2, device))
    fw.sort()
    bw.sort()
    return fw[len(fw) // 2], bw[len(bw) // 2]


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fwd: Callable[[], torch.Tensor]) -> int:
    """aten operators one forward and the backward of its output dispatch."""
    with _CountOps() as counter:
        out = fwd()
        out.backward(torch.ones_like(out))
    return counter.count


def forward_flops(fwd: Callable[[], torch.Tensor]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fwd()
    return float(counter.get_total_flops())


def layer_rows(grid: LayerGrid, device: torch.device, precision: str,
               progress: Progress | None = None) -> list[list[object]]:
    """Rows (see COLUMNS) for every layer, family and shape of `grid`; norms only at tp 1
    (tensor parallelism does not shard them; sequence parallelism is a shorter sequence)."""
    dtype = DTYPES[precision]
    models = layer_models(device, max(grid.seq))
    todo = [(layer, fam, b, s, t) for fam in models for layer in LAYERS for t in grid.tp
            for s in grid.seq for b in grid.mbs if not (layer == "norm" and t > 1)]
    rows: list[list[object]] = []
    ops: dict[tuple[str, str, int], int] = {}  # the count does not depend on the shape
    for i, (layer, fam, b, s, t) in enumerate(todo):
        if progress:
            progress(i, len(todo), f"{fam} {layer} mbs={b} seq={s} tp={t}")
        spec = models[fam]
        mod = build_layer(layer, spec, t, device, dtype)
        fwd = _forward_fn(layer, mod, spec, b, s, t, device, dtype)
        fwd_s, bwd_s = time_forward_backward(fwd, device, grid.repeats, grid.warmup)
        n_ops = ops.setdefault((layer, fam, t), aten_ops(fwd))
        rows.append([layer, fam, b, s, t, spec.hidden_size, fwd_s, bwd_s, forward_flops(fwd),
                     n_ops])
    if progress:
        progress(len(todo), len(todo), "bytes kept for backward per recompute policy")
    return rows


def measured_tables(device: torch.device, precision: str, quick: bool,
                    progress: Progress | None = None) -> dict[str, Any]:
    """The profile's `measured` entries: layer_models (the shapes' model specs, seq_len aside),
    layers (timings) and saved_activations (bytes per block and recompute policy)."""
    from autoplan.profiler.activations import COLUMNS as SAVED_COLUMNS
    from autoplan.profiler.activations import saved_rows

    grid = layer_grid(device, quick)
    models = {k: to_dict(v) for k, v in layer_models(device, max(grid.seq)).items()}
    rows = layer_rows(grid, device, precision, progress)
    return {
        "layer_models": models,
        "layers": {"columns": list(COLUMNS), "repeats": grid.repeats, "rows": rows},
        "saved_activations": {"columns": list(SAVED_COLUMNS), "precision": precision,
                              "rows": saved_rows(device, precision, quick)},
    }
