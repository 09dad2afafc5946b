"""autoplan-cpu's attention_compute_dtype: a 16-bit plan's fused attention core runs in fp32 on
CPU (q, k, v cast up, the output cast back), the CUDA runtime and eager attention keep the
plan's dtype, and the casts move the bytes the cost model charges for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autoplan.cost.elementwise import attention_cast_bytes
from autoplan.model_spec import PRESETS
from autoplan.plan import Attention as AttentionKind
from autoplan.runtime.context_parallel import LoadBalancedLayout
from autoplan.runtime.models.init import materialize_and_init
from autoplan.runtime.models.layers import Attention, set_attention
from autoplan.runtime.models.transformer import build_meta_model

SDPA_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"


class _Record(TorchDispatchMode):
    """The dtypes of q, k, v each CPU flash-attention op (forward, backward) is handed, and
    the bytes the dtype casts (aten._to_copy) read and write."""

    def __init__(self) -> None:
        super().__init__()
        self.sdpa: list[tuple[str, set[torch.dtype]]] = []
        self.cast_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func)
        if name.startswith(SDPA_CPU):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            qkv = tensors[1:4] if "backward" in name else tensors[:3]  # backward: grad_out first
            self.sdpa.append((name, {t.dtype for t in qkv}))
        if name.startswith("aten._to_copy"):
            self.cast_bytes += args[0].numel() * args[0].element_size() + \
                out.numel() * out.element_size()
        return out


def _bf16_model(name: str, kind: AttentionKind, device_type: str | None):
    spec = PRESETS[name]
    model = build_meta_model(spec)
    set_attention(model, kind, device_type)
    materialize_and_init(model, torch.device("cpu"), spec.num_layers, seed=0)
    return spec, model.to(torch.bfloat16)


@pytest.mark.parametrize("device_type, kind, want", [
    ("cpu", AttentionKind.FLASH, torch.float32),  # autoplan-cpu: attention_compute_dtype fp32
    ("cuda", AttentionKind.FLASH, None),  # autoplan-cuda: the plan's dtype
    ("cpu", AttentionKind.EAGER, None),  # the trait is the fused kernel's
    (None, AttentionKind.FLASH, None),  # a model built outside the runtime
])
def test_set_attention_takes_the_core_dtype_from_the_runtime_traits(device_type, kind, want):
    _, model = _bf16_model("tiny", kind, device_type)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    assert layers and all(m.compute_dtype == want for m in layers)


@pytest.mark.parametrize("device_type, want", [("cpu", torch.float32), (None, torch.bfloat16)])
def test_the_cpu_kernel_sees_fp32_in_a_bf16_model_forward_and_backward(device_type, want):
    spec, model = _bf16_model("tiny-llama", AttentionKind.FLASH, device_type)
    tokens = torch.randint(0, spec.vocab_size, (2, spec.seq_len),
                           generator=torch.Generator().manual_seed(0))
    with _Record() as rec:
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
    assert logits.dtype == torch.bfloat16
    names = [n for n, _ in rec.sdpa]
    assert sum("backward" in n for n in names) == sum("backward" not in n for n in names) \
        == spec.num_layers
    assert all(dtypes == {want} for _, dtypes in rec.sdpa), rec.sdpa
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())


def test_the_fp32_core_is_sdpa_in_fp32_rounded_once_to_bf16():
    spec = PRESETS["tiny-llama"]  # GQA: 4 query heads over 2 K/V heads
    layer = Attention(spec)
    layer.compute_dtype = torch.float32
    gen = torch.Generator().manual_seed(2)
    shape_q, shape_kv = (2, 4, 64, 16), (2, 2, 64, 16)
    q = torch.randn(shape_q, generator=gen).bfloat16().requires_grad_()
    k, v = (torch.randn(shape_kv, generator=gen).bfloat16().requires_grad_() for _ in range(2))
    grad = torch.randn(shape_q, generator=gen).bfloat16()
    out = layer.core(q, k, v)
    got = torch.autograd.grad(out, (q, k, v), grad)

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32.repeat_interleave(2, 1),
                                         v32.repeat_interleave(2, 1), is_causal=True)
    want = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.to(torch.bfloat16))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16 and torch.equal(g, w.to(torch.bfloat16))


def _counted_cast_bytes(layer: Attention, q, k, v, calls) -> int:
    with _Record() as rec:
        out = torch.cat([layer.core(q[:, :, sl], k[:, :, :end], v[:, :, :end])
                         for sl, end in calls], dim=2)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return rec.cast_bytes


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_the_cast_bytes_priced_are_the_casts_the_core_runs(name):
    spec = PRESETS[name]
    layer = Attention(spec)
    layer.compute_dtype = torch.float32
    b, s, d = 2, spec.seq_len, spec.head_width

    def inputs(length):
        return (torch.randn(b, spec.num_heads, length, d).bfloat16().requires_grad_(),
                *(torch.randn(b, spec.kv_heads, length, d).bfloat16().requires_grad_()
                  for _ in range(2)))

    one = np.array(1.0)
    counted = _counted_cast_bytes(layer, *inputs(s), [(slice(None), s)])
    assert counted == attention_cast_bytes(spec, np.array(float(b * s)), one, one)

    # context parallelism (cp 2, rank 0): each local query chunk over the keys up to its end,
    # as context_parallel.ContextParallel.attention calls the core
    cp, local = 2, s // 2
    c = local // 2
    q, _, _ = inputs(local)
    _, k, v = inputs(s)
    calls = [(slice(i * c, (i + 1) * c), (j + 1) * c)
             for i, j in enumerate(LoadBalancedLayout(cp, 0).chunks)]
    counted = _counted_cast_bytes(layer, q, k, v, calls)
    assert counted == attention_cast_bytes(spec, np.array(float(b * local)), one, np.array(2.0))


def test_the_cost_model_keeps_the_upcast_cores_fp32_copies() -> None:
    """A bf16 tiny block under autoplan-cpu (core in fp32) keeps more for backward than with the
    core in bf16; the cost model's `attn_upcast` part is that difference, byte for byte."""
    from autoplan.cost.rows import rows_of
    from autoplan.cost.runtimes import load_runtime
    from autoplan.cost.step_memory import activation_parts
    from autoplan.plan import plan_from_dict
    from autoplan.plan_table import plan_to_row
    from autoplan.profiler.activations import saved_bytes

    b = 4
    spec, model = _bf16_model("tiny", AttentionKind.FLASH, "cpu")
    block = model.layers["0"]
    x = torch.randn(b, spec.seq_len, spec.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    upcast = saved_bytes(block, x)
    block.attention.compute_dtype = None
    plain = saved_bytes(block, x)
    plan = plan_from_dict({"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
                           "precision": "bf16",
                           "batch": {"micro_batch_size": b, "global_batch_size": b}})
    traits = load_runtime("autoplan", on_cpu=True)
    r = rows_of(plan_to_row(plan, spec), spec, "bf16", traits)
    extra = float(np.ravel(activation_parts(spec, r, False, traits, "bf16")["attn_upcast"])[0])
    assert upcast - plain == extra > 0
