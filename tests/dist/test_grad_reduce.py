"""Gradient reduce dtype: grad_reduce_dtype=bf16 puts bf16 gradients on the wire and rounds the
reduced gradients once at bf16's precision; fp32 (the default) reduces in fp32."""

from __future__ import annotations

import pytest

from tests.dist.parity import make_plan, rel_err

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

BF16_UNIT_ROUNDOFF = 2.0**-8
"""bf16 keeps an 8-bit significand (7 stored bits + the implicit one), so rounding to nearest
errs by at most 2^-8 relative (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
§2.1: u = 1/2 * beta^(1-t), beta 2, t 8). At dp 2 the reduce-scatter sums two bf16 gradients
(divided by 2, exactly, for the average), one rounding per element, so the reduced gradient
is within u of the fp32 reduction of the same bf16 inputs, element-wise and in norm."""
REDUCE_OPS = ("reduce_scatter",)
"""c10d dispatcher ops (torch.ops.c10d.*) whose tensors are gradients being reduced: FSDP2's
reduce-scatter (ZeRO-2 at dp 2 has no replica all-reduce; the trainer's fp64 all-reduces of
the loss and gradient norm are not gradients)."""


def _wire_dtypes_rank(rank: int, world_size: int, plan) -> dict:
    """One training step of `plan`; the dtypes of every tensor the c10d reduce ops received
    (recorded by a dispatch mode: what went on the wire) and the step-1 gradients."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests.dist.parity import full_values, one_step_setup

    seen: list[str] = []

    class WireDtypes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__
            if func.namespace == "c10d" and any(op in name for op in REDUCE_OPS):
                for a in args:
                    for t in a if isinstance(a, (list, tuple)) else [a]:
                        if isinstance(t, torch.Tensor) and t.numel() > 1:
                            seen.append(str(t.dtype))
            return func(*args, **(kwargs or {}))

    trainer, x, y, spec = one_step_setup(plan)
    grads: dict = {}
    with WireDtypes():
        trainer.train_step(x, y, grad_hook=lambda tr, step: grads.update(
            full_values(tr.pm.parts, grad=True, vocab=spec.vocab_size)))
    return {"wire": sorted(set(seen)), "grads": grads}


def run_wire(pool, plan, bug: str | None = None) -> dict:
    if bug is None:
        return pool.run(_wire_dtypes_rank, plan.world_size, plan)[0]
    return pool.run(_planted_wire_rank, plan.world_size, plan, bug)[0]


def _planted_wire_rank(rank: int, world_size: int, plan, bug: str) -> dict:
    from tests.dist import bugs

    with bugs.planted(bug):
        return _wire_dtypes_rank(rank, world_size, plan)


def test_bf16_reduce_puts_bf16_on_the_wire_within_one_rounding_of_fp32(pool):
    """The same bf16 plan (dp 2, ZeRO-2) reduced in fp32 and in bf16: the reduce ops carry
    float32, resp. bfloat16 tensors, and the bf16-reduced step-1 gradients differ from the
    fp32-reduced ones by more than 0 and at most bf16's unit round-off."""
    fp32 = run_wire(pool, make_plan(dp=2, zero=2, precision="bf16", grad_reduce="fp32"))
    bf16 = run_wire(pool, make_plan(dp=2, zero=2, precision="bf16", grad_reduce="bf16"))
    default = run_wire(pool, make_plan(dp=2, zero=2, precision="bf16"))
    assert fp32["wire"] == ["torch.float32"] == default["wire"]
    assert bf16["wire"] == ["torch.bfloat16"]
    errs = {name: rel_err(bf16["grads"][name], g) for name, g in fp32["grads"].items()
            if float((g ** 2).sum()) > 0}
    assert max(errs.values()) <= BF16_UNIT_ROUNDOFF, errs
    assert max(errs.values()) > 0, "bf16 reduction rounded nothing"


def test_planted_fp32_reduce_when_bf16_asked_is_caught(pool):
    """A runtime that ignores grad_reduce_dtype (reduces in fp32 anyway) is caught by the
    dtype on the wire."""
    plan = make_plan(dp=2, zero=2, precision="bf16", grad_reduce="bf16")
    buggy = run_wire(pool, plan, bug="reduce-dtype-ignored")
    assert buggy["wire"] != ["torch.bfloat16"]


def test_bf16_reduce_reaches_the_routed_experts(pool):
    """The routed experts' own FSDP2 group (expert-DP 2: tiny-moe, ep 2 over dp 4) reduces in
    the plan's grad_reduce_dtype as the blocks do, and as the cost model prices their bytes
    (it reduced them in fp32 whatever the plan said)."""
    from tests.dist.test_moe_parity import moe_plan

    plan = moe_plan(ep=2, dp=4, zero=2, precision="bf16", grad_reduce="bf16", mbs=2, gbs=8)
    assert run_wire(pool, plan)["wire"] == ["torch.bfloat16"]
