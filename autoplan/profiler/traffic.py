"""Bytes that eager PyTorch's element-wise kernels move in one transformer block, counted.

Every aten op of the runtime's block, forward and backward, is seen by a dispatch mode; the
bytes of its tensor inputs and outputs are added up for each op that is neither a GEMM, nor
fused attention, nor a view (views move nothing). Eager PyTorch runs each such op as its own
kernel reading its inputs from and writing its output to device memory, so this is the
element-wise HBM traffic of an eager runtime (autoplan's own, torchtitan without compile). The
cost model holds the per-token coefficients (elementwise.EAGER_BYTES_PER_TOKEN); a unit test
recounts them with `traffic_coefficients`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.model_spec import ModelSpec

SKIPPED = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.",
           "aten._scaled_dot_product", "aten.scaled_dot_product")
"""GEMMs and fused attention: priced by FLOPs, not by the bytes they move."""


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class _CountBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if not name.startswith(SKIPPED) and not func.is_view:
            self.bytes += _nbytes(args) + _nbytes(list((kwargs or {}).values())) + _nbytes(out)
        return out


def block_traffic_bytes(spec: ModelSpec, b: int, s: int,
                        dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(forward, backward) bytes the element-wise ops of one block move for b x s tokens."""
    from autoplan.runtime.models.init import materialize_and_init
    from autoplan.runtime.models.transformer import build_meta_model

    spec = replace(spec, num_layers=1, seq_len=s)
    model = build_meta_model(spec, 0.0)
    materialize_and_init(model, torch.device("cpu"), 1, 0)
    block = model.layers["0"].to(dtype)
    x = torch.randn(b, s, spec.hidden_size, dtype=dtype, requires_grad=True)
    with _CountBytes() as fwd:
        out = block(x)
    grad = torch.ones_like(out)
    with _CountBytes() as bwd:
        out.backward(grad)
    return fwd.bytes, bwd.bytes


def traffic_coefficients(base: ModelSpec, b: int = 2, s: int = 16) -> dict[str, float]:
    """Bytes per token per block, forward + backward, as c_h*h + c_f*f + c_q*(a*d) +
    c_kv*(kv*d) + c_0: solved exactly from blocks of five shapes of `base`'s family (each op's
    tensors are tokens x one of these widths; c_0 holds what does not scale with them)."""
    d = 8
    shapes = [(4, 4, 64, 128), (8, 4, 64, 128), (4, 2, 64, 128), (4, 4, 96, 128),
              (4, 4, 64, 192), (4, 1, 64, 128)]  # heads, kv heads, hidden, ffn
    rows, ys = [], []
    for a, kv, h, f in shapes:
        spec = replace(base, num_heads=a, num_kv_heads=kv, hidden_size=h, ffn_hidden_size=f,
                       head_dim=d) if "head_dim" in base.__dataclass_fields__ else replace(
            base, num_heads=a, num_kv_heads=kv, hidden_size=h, ffn_hidden_size=f)
        dd = spec.hidden_size // spec.num_heads if getattr(spec, "head_dim", None) is None \
            else spec.head_dim
        fwd, bwd = block_traffic_bytes(spec, b, s)
        rows.append([h, f, a * dd, kv * dd, 1.0])
        ys.append((fwd + bwd) / (b * s))
    coef, *_ = np.linalg.lstsq(np.array(rows, float), np.array(ys, float), rcond=None)
    return dict(zip(("h", "f", "q", "kv", "const"), (float(c) for c in coef), strict=True))
