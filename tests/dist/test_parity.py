"""PARITY: every layout matches the single-process fp32 run (losses, gradients, parameters).

The covering set below is a table of named plans: every dp x tp x pp factorisation of 1, 2, 4
and 8 ranks appears, context parallelism alone and with each of dp, tp and pp, and the other
knobs (sequence parallelism, ZeRO 0-3, offload of params or of the optimizer only, recompute,
eager attention, tied embeddings under tp and pp, an odd vocabulary that the runtime pads to a
multiple of 128*tp, schedule, model family, optimizer) are spread
so that every value occurs and most pairs do.
`-m slow` runs the full product (tests/dist/test_parity_full.py).
"""

from __future__ import annotations

import pytest

from tests.dist.parity import compare, make_plan, reference_plan, run_parity

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

ADAM_PARAM_ATOL = 2e-7
"""Per-element RMS floor for parameters after 10 AdamW steps: Adam divides each element by its
own gradient scale, so round-off in a near-zero gradient element becomes a step of ~lr; losses
and gradients are still held to 1e-5 relative and the SGD rows to 1e-5 without floor."""

C = dict  # one row of the covering set
COVERING = {
    # 1 rank
    "1r-zero3-offload-full": C(model="tiny", zero=3, offload=True, recompute="full"),
    # 2 ranks
    "dp2-ddp-sgd": C(model="tiny", dp=2, optim="sgd"),
    "cp2-llama-selective": C(model="tiny-llama", cp=2, recompute="selective"),
    # eager attention's causal mask on a chunk whose queries sit at the end of the keys
    "cp2-llama-eager-sgd": C(model="tiny-llama", cp=2, attention="eager", optim="sgd"),
    "tp2-sp-llama-selective-eager": C(model="tiny-llama", tp=2, sp=True, recompute="selective",
                                      attention="eager"),
    "tp2-odd-vocab": C(model="odd-vocab", tp=2),
    "tp2-sp-odd-vocab-tied-sgd": C(model="odd-vocab-tied", tp=2, sp=True, optim="sgd"),
    "pp2-gpipe-uneven-full-sgd-clip": C(model="tiny", pp=2, schedule="gpipe",
                                        layers_per_stage=(1, 3), recompute="full",
                                        optim="sgd", clip=0.5),
    # three chunks per rank (searches emit vpp up to 8): interleaved beside ZeRO-1 with the
    # optimizer alone on the host, and torch's looped zero-bubble schedule
    "pp2-interleaved3-zero1-optoffload": C(model="tiny8-gpt", pp=2, zero=1, offload=True,
                                           offload_params=False, schedule="interleaved-1f1b",
                                           vpp=3, layers_per_stage=(1, 2, 1, 2, 1, 1), mbs=1),
    "pp2-zerobubble3-sgd": C(model="tiny8-gpt", pp=2, schedule="zero-bubble", vpp=3,
                             layers_per_stage=(1, 2, 1, 2, 1, 1), mbs=1, optim="sgd"),
    # 4 ranks
    "dp4-zero1-selective": C(model="tiny", dp=4, zero=1, recompute="selective"),
    "tp4-nosp-tied-sgd": C(model="tiny-tied", tp=4, optim="sgd"),
    "pp4-1f1b-llama": C(model="tiny-llama", pp=4, mbs=1),
    "dp2tp2-sp-zero2-optoffload-full-sgd-clip": C(model="tiny", dp=2, tp=2, sp=True, zero=2,
                                                  offload=True, offload_params=False,
                                                  recompute="full", optim="sgd", clip=0.5),
    "dp2pp2-zero3-optoffload-interleaved-llama": C(model="tiny-llama", dp=2, pp=2, zero=3,
                                                   offload=True, offload_params=False,
                                                   schedule="interleaved-1f1b", vpp=2, mbs=1),
    "tp2pp2-sp-zerobubble-full-sgd": C(model="tiny", tp=2, pp=2, sp=True,
                                       schedule="zero-bubble", recompute="full", optim="sgd"),
    "dp2pp2-zbv-zero2-tied-sgd": C(model="tiny-tied", dp=2, pp=2, zero=2,
                                   schedule="zero-bubble", vpp=2, mbs=1, optim="sgd"),
    "cp2tp2-sp-zero1-full-sgd": C(model="tiny", cp=2, tp=2, sp=True, zero=1, recompute="full",
                                  optim="sgd"),
    "dp2cp2-zero3": C(model="tiny", dp=2, cp=2, zero=3),
    "cp2pp2-zero2-llama-sgd": C(model="tiny-llama", cp=2, pp=2, zero=2, optim="sgd"),
    "cp4-llama-gqa-zero1": C(model="tiny-llama", cp=4, zero=1),
    "dp4-hsdp-shard2-zero3": C(model="tiny", dp=4, dp_shard=2, zero=3),
    "dp4-hsdp-shard2-zero1-llama-sgd": C(model="tiny-llama", dp=4, dp_shard=2, zero=1,
                                         optim="sgd"),
    # 8 ranks
    "dp8-zero3": C(model="h8-2l", dp=8, zero=3, mbs=1),
    "tp8-sp-sgd": C(model="h8-2l", tp=8, sp=True, optim="sgd"),
    "pp8-gpipe-llama-full": C(model="tiny8-llama", pp=8, schedule="gpipe", mbs=1,
                              recompute="full", recompute_layers=1),
    "dp4tp2-zero1-selective-llama-tied-sgd": C(model="tiny-llama-tied", dp=4, tp=2, zero=1,
                                               mbs=1, recompute="selective", optim="sgd"),
    "dp4pp2-ddpfsdp-1f1b": C(model="tiny8-gpt", dp=4, pp=2, mbs=1),
    "dp2tp4-sp-zero3-offload-llama": C(model="llama-h8kv4-4l", dp=2, tp=4, sp=True, zero=3,
                                       offload=True),
    "tp4pp2-sp-interleaved-selective-sgd": C(model="tiny", tp=4, pp=2, sp=True,
                                             schedule="interleaved-1f1b", vpp=2,
                                             recompute="selective", optim="sgd"),
    "dp2pp4-zbv-zero2-full-llama": C(model="tiny8-llama", dp=2, pp=4, zero=2,
                                     schedule="zero-bubble", vpp=2, mbs=1, recompute="full"),
    "tp2pp4-interleaved-sgd": C(model="tiny8-gpt", tp=2, pp=4, schedule="interleaved-1f1b",
                                vpp=2, optim="sgd"),
    "dp2tp2pp2-sp-zero3-offload-selective-llama": C(model="llama-h8kv4-4l", dp=2, tp=2, pp=2,
                                                    sp=True, zero=3, offload=True,
                                                    recompute="selective"),
}


def check_parity(pool, reference_cache, row: dict, steps: int = 10) -> None:
    row = dict(row)
    optim, clip = row.pop("optim", "adamw"), row.pop("clip", 0.0)
    plan = make_plan(**row)
    key = (str(plan.model), plan.batch, optim, steps, clip)
    if key not in reference_cache:
        reference_cache[key] = run_parity(pool, reference_plan(plan), steps, optim, clip=clip)
    run = run_parity(pool, plan, steps, optim, clip=clip)
    atol = ADAM_PARAM_ATOL if optim == "adamw" else 0.0
    problems = compare(run, reference_cache[key], param_atol=atol)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("name", list(COVERING))
def test_covering_set_matches_single_process(pool, reference_cache, name):
    check_parity(pool, reference_cache, COVERING[name])


def test_recompute_and_offload_are_bitwise_neutral_and_runs_repeat(pool):
    """Plans that differ only in recompute/offload (params, or the optimizer only) give
    bitwise-equal losses; the same plan run twice is bitwise identical."""
    base = dict(dp=2, zero=3)
    variants = [make_plan(**base), make_plan(**base, recompute="full"),
                make_plan(**base, recompute="selective", recompute_layers=2),
                make_plan(**base, offload=True),
                make_plan(**base, offload=True, offload_params=False), make_plan(**base)]
    losses = [run_parity(pool, v, 5, "adamw", capture=(1,))["losses"] for v in variants]
    for v, got in zip(variants[1:], losses[1:], strict=True):
        assert got == losses[0], (v.recompute, v.offload)


def test_bf16_mixed_precision_trains_close_to_fp32(pool):
    """bf16 compute with fp32 master weights and reductions (FSDP2 MixedPrecisionPolicy), under
    data, tensor+sequence and pipeline parallelism, stays within 2% of the fp32 losses."""
    ref = run_parity(pool, make_plan(), 5, "adamw", capture=())
    for plan in (make_plan(dp=2, zero=2, precision="bf16"),
                 make_plan(tp=2, pp=2, sp=True, precision="bf16")):
        got = run_parity(pool, plan, 5, "adamw", capture=())
        for a, b in zip(got["losses"], ref["losses"], strict=True):
            assert a == pytest.approx(b, rel=2e-2), plan.parallel
