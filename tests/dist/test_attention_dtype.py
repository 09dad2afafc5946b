"""bf16 plans on CPU run their attention core in fp32 (autoplan-cpu's attention_compute_dtype)
through parallelize(), context parallelism included, and still train like one process."""

from __future__ import annotations

import pytest

from tests.dist.parity import make_plan, run_parity

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

SDPA_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"
BF16_RTOL = 1e-4
"""cp 2 against one process, both bf16 with the fp32 core: measured up to 9e-6 relative over
5 AdamW steps (the loss is fp32; only the bf16 rounding of the chunked outputs differs)."""


def _sdpa_dtypes_rank(rank: int, world_size: int, plan) -> list[str]:
    """One training step of `plan` on this rank; the dtypes of q, k, v the CPU flash kernel
    was handed, forward and backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests.dist.parity import one_step_setup

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith(SDPA_CPU):
                tensors = [a for a in args if isinstance(a, torch.Tensor)]
                qkv = tensors[1:4] if "backward" in name else tensors[:3]
                seen.update(f"{'bwd' if 'backward' in name else 'fwd'} {t.dtype}" for t in qkv)
            return func(*args, **(kwargs or {}))

    trainer, x, y, _ = one_step_setup(plan)
    with Record():
        trainer.train_step(x, y)
    return sorted(seen)


@pytest.mark.parametrize("layout", [dict(dp=2, zero=2), dict(cp=2, zero=3)])
def test_a_bf16_plans_cpu_attention_kernel_computes_in_fp32(pool, layout):
    plan = make_plan("tiny-llama", precision="bf16", **layout)
    for seen in pool.run(_sdpa_dtypes_rank, plan.world_size, plan):
        assert seen == ["bwd torch.float32", "fwd torch.float32"], seen


def test_context_parallel_bf16_trains_like_one_bf16_process(pool):
    """cp 2 with the fp32 core against one bf16 process (the same casts, one core call per
    layer instead of two masked chunks over gathered K/V)."""
    ref = run_parity(pool, make_plan("tiny-llama", precision="bf16"), 5, "adamw", capture=())
    got = run_parity(pool, make_plan("tiny-llama", cp=2, zero=3, precision="bf16"), 5, "adamw",
                     capture=())
    for a, b in zip(got["losses"], ref["losses"], strict=True):
        assert a == pytest.approx(b, rel=BF16_RTOL)
