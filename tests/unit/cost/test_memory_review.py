"""Memory terms checked against the code that allocates them: torch's zero-bubble schedules
replayed action by action, what stage_backward_input keeps until W, the loss's backward peak,
PyTorch ring attention's gathered K/V, FSDP2's ZeRO-1 with one micro-batch, DeepSpeed ZeRO-2's
contiguous bucket and ZeRO-3's expert units. The torch measurements run in one process on the
CPU allocator's own events (torch.profiler with profile_memory)."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import activations, memory, pipeline, step_memory
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.model_spec import PRESETS, ModelSpec
from autoplan.plan import plan_from_dict
from autoplan.plan_table import ZERO_BUBBLE, plan_to_row

torch = pytest.importorskip("torch")
schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

GIB = 2.0**30


def _alive(fn, marks: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """(event times, bytes alive after each allocator event, start time of each record_function
    named in `marks`) over fn(), counted from its start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    allocs = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    starts = {e.name(): e.start_ns() for e in events if e.name() in marks}
    return (np.array([t for t, _ in allocs]), np.cumsum([n for _, n in allocs]), starts)


# --- zero-bubble: torch's schedules replayed -----------------------------------------------

def _rank_actions(cls, pp: int, vpp: int, m: int, rank: int) -> list:
    """One rank's actions as torch builds them (_calculate_single_rank_operations), without
    stages or a process group."""
    sched = object.__new__(cls)
    sched.pp_group_size, sched.n_local_stages, sched.rank = pp, vpp, rank
    sched._n_microbatches = m
    sched.number_of_rounds = max(1, m // pp)
    sched.microbatches_per_round = m // sched.number_of_rounds
    sched.num_stages = sched._num_stages = pp * vpp
    return [a for a in sched._calculate_single_rank_operations(rank) if a is not None]


def _replay(actions: list, vpp: int, weight: float) -> tuple[float, float]:
    """(saved, pending) layer sets at the peak of saved + weight * pending: F saves a chunk,
    I captures its W's gradients (stage 0 runs no I), W frees both (stage_backward_input
    retains the graph), a full backward frees the chunk."""
    saved = pending = 0
    best = (-1.0, 0, 0)
    for a in actions:
        kind = str(a.computation_type)
        if kind.endswith("FORWARD") and "BACKWARD" not in kind or kind == "F":
            saved += 1
        elif "INPUT" in kind or kind == "I":
            pending += a.stage_index != 0
        elif "WEIGHT" in kind or kind == "W":
            saved -= 1
            pending -= a.stage_index != 0
        elif "BACKWARD" in kind or kind == "B":
            saved -= 1
        if saved + weight * pending > best[0]:
            best = (saved + weight * pending, saved, pending)
    return best[1] / vpp, best[2] / vpp


LOOPED = [(pp, v, m) for pp in (2, 4, 8) for v in (1, 3, 4) for m in (pp, pp + 1, 2 * pp, 4 * pp)
          if m % max(1, m // pp) == 0]


@pytest.mark.parametrize(("pp", "vpp", "m"), LOOPED)
def test_interleaved_zero_bubble_keeps_activations_until_w_on_every_rank(pp, vpp, m) -> None:
    """ScheduleInterleavedZeroBubble (ZB-H1 at vpp 1): every rank holds min(pp, m) layer sets
    when pp divides m (the model priced 1 on the last rank and pp - 1 on a middle one), rank k
    k + 1 chunks' gradients for W, and the last rank min(pp, m) of its loss stage's."""
    A = np.array
    counts = [f(A([ZERO_BUBBLE]), A([pp]), A([vpp]), A([m]))[0] for f in (
        pipeline.in_flight_microbatches, pipeline.in_flight_middle_rank,
        pipeline.in_flight_last_rank)]
    zb = pipeline.deferred_weight_grads(A([ZERO_BUBBLE]), A([pp]), A([vpp]), A([m]))
    cls = schedules.ScheduleInterleavedZeroBubble
    ranks = (0, max(pp - 2, 0), pp - 1)
    for rank, saved, pending in zip(ranks, counts, (zb.first, zb.mid, zb.last), strict=True):
        assert _replay(_rank_actions(cls, pp, vpp, m, rank), vpp, 0.0)[0] == pytest.approx(
            saved), rank
        # saved stays level through the steady state, so the pending peak sits beside it
        assert _replay(_rank_actions(cls, pp, vpp, m, rank), vpp, 100.0) == pytest.approx(
            (saved, pending[0])), rank
    assert zb.head[0] == min(pp, m)


@pytest.mark.parametrize(("pp", "m"), [(pp, m) for pp in (2, 4, 8)
                                       for m in (pp, pp + 1, 2 * pp - 1, 2 * pp, 4 * pp)])
def test_zb_v_ranks_hold_what_its_schedule_replays(pp, m) -> None:
    """ScheduleZBVZeroBubble: rank 0 keeps min(pp, (m + 1)/2) and the last rank pp layer sets
    (where the model had 1), and the cool-down, which defers every W to the end, holds c layer
    sets of activations and c of gradients on the last rank."""
    A = np.array
    args = (A([ZERO_BUBBLE]), A([pp]), A([2]), A([m]))
    zb = pipeline.deferred_weight_grads(*args)
    cls = schedules.ScheduleZBVZeroBubble
    first = _replay(_rank_actions(cls, pp, 2, m, 0), 2, 0.0)
    last = _replay(_rank_actions(cls, pp, 2, m, pp - 1), 2, 0.0)
    assert first[0] == pytest.approx(pipeline.in_flight_microbatches(*args)[0])
    assert last[0] == pytest.approx(pipeline.in_flight_last_rank(*args)[0])
    assert _replay(_rank_actions(cls, pp, 2, m, 0), 2, 100.0)[1] == zb.first[0] == 0.5
    cool = _replay(_rank_actions(cls, pp, 2, m, pp - 1), 2, 100.0)
    if m > pp:
        assert cool == pytest.approx((zb.v_cooldown[0], zb.v_cooldown[0]))
    # a middle rank holds no more than the bound the model prices it by
    for rank in range(1, pp - 1):
        saved, pending = _replay(_rank_actions(cls, pp, 2, m, rank), 2, 100.0)
        mid = pipeline.in_flight_middle_rank(*args)[0]
        assert saved + pending <= max(mid + zb.mid[0], 2 * zb.v_cooldown[0]) + 1e-9


def test_stage_backward_input_keeps_the_weight_ops_output_gradients_until_w() -> None:
    """torch's I step keeps every saved tensor (retain_graph=True) and, per block, the
    gradients entering its weight-gradient nodes until W (memory.weight_grad_input_bytes),
    measured on two of the runtime's GPT blocks; the head keeps its 16-bit logit gradient
    (2 bytes per logit) and frees the loss's softmax."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.profiler import record_function

    from autoplan.runtime.models.transformer import Block
    from autoplan.runtime.parallelize import loss_function

    torch.manual_seed(0)
    spec = ModelSpec(name="t", num_layers=2, hidden_size=512, num_heads=8, vocab_size=1024,
                     seq_len=256)
    blocks = torch.nn.Sequential(Block(spec), Block(spec)).to(torch.bfloat16)
    x = torch.randn(1, 256, 512, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, 256, 512, dtype=torch.bfloat16)
    state: dict = {}

    def run() -> None:
        with record_function("F"):
            state["out"] = blocks(x)
        with record_function("I"):
            state["groups"] = stage_backward_input([state.pop("out")], [g], [x],
                                                   blocks.parameters())[1]
        with record_function("W"):
            stage_backward_weight(blocks.parameters(), state.pop("groups"))

    t, alive, starts = _alive(run, ("F", "I", "W"))
    after_forward = alive[t < starts["I"]][-1]  # the saved tensors and the output
    # after I: the output is gone and x's gradient (as large) has come
    kept_for_w = alive[t < starts["W"]][-1]
    saved = activations.activation_elements_per_layer(spec, np.array(1), np.array(1),
                                                      np.array(False), np.array(1), False)
    counted = 2 * float(memory.weight_grad_input_bytes(saved))
    assert kept_for_w - after_forward == pytest.approx(counted, rel=0.06)

    head = torch.nn.Linear(64, 32000, bias=False).to(torch.bfloat16)
    h = torch.randn(1, 2048, 64, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 32000, (1, 2048))
    loss_fn = loss_function(32000, 32000)

    def head_step() -> None:
        loss = loss_fn(head(h), y)
        state["groups"] = stage_backward_input([loss], None, [h], head.parameters())[1]

    after_i = _alive(head_step)[1][-1] - h.numel() * 2
    assert after_i / (2048 * 32000) == pytest.approx(2.0, abs=0.05)
    state.clear()


def test_zero_bubble_prices_what_its_ranks_keep() -> None:
    """pp 4 ZB-H1: the last rank holds 4 micro-batches' blocks (the model priced 1), their W's
    gradients and 4 logit gradients; 1F1B's last rank one micro-batch and none of those."""
    model = PRESETS["llama-3-8b"]
    rt = load_runtime("autoplan-cuda")

    def last_rank(schedule: str) -> tuple[float, float]:
        plan = plan_from_dict({"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb",
                                                                  "num_gpus": 8},
                               "parallel": {"dp": 2, "pp": 4}, "zero_stage": 1,
                               "pipeline": {"schedule": schedule},
                               "batch": {"micro_batch_size": 1, "global_batch_size": 16}})
        r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
        parts = step_memory.activation_parts(model, r, False, rt, "bf16")
        acts = step_memory.stage_activation_bytes(model, r, "bf16", False, rt, parts)
        return float(acts.last[0]), float(acts.ends[1][0])

    one_f, end = last_rank("1f1b")
    zb, _ = last_rank("zero-bubble")
    assert zb - one_f > 3.0 * end


# --- the loss ---------------------------------------------------------------------------------

def test_torch_cross_entropy_peaks_at_12_bytes_per_logit_in_backward() -> None:
    """autoplan's loss (runtime/parallelize.py loss_function: F.cross_entropy on the .float()
    upcast, as torchtitan's): 4 bytes per logit kept after forward, 10 at the forward's peak,
    12 at the backward's (the saved log-softmax, nll_loss_backward's dense fp32 gradient and
    log_softmax_backward's fp32 result). The runtimes that run it price saved 4 + 8."""
    from torch.profiler import record_function

    from autoplan.runtime.parallelize import loss_function

    torch.manual_seed(0)
    head = torch.nn.Linear(64, 32000, bias=False).to(torch.bfloat16)
    x = torch.randn(1, 2048, 64, dtype=torch.bfloat16, requires_grad=True)
    y = torch.randint(0, 32000, (1, 2048))
    head.weight.grad = torch.zeros_like(head.weight)

    def run() -> None:
        loss = loss_function(32000, 32000)(head(x), y)
        with record_function("BWD"):
            loss.backward()

    t, alive, starts = _alive(run, ("BWD",))
    n = 2048 * 32000
    backward = t >= starts["BWD"]
    assert alive[~backward][-1] / n == pytest.approx(4.0, abs=0.05)
    assert alive[~backward].max() / n == pytest.approx(10.0, abs=0.05)
    assert alive[backward].max() / n == pytest.approx(12.0, abs=0.05)
    for name in ("autoplan-cuda", "autoplan-cpu", "torchtitan", "torchtitan-0.3"):
        rt = load_runtime(name)
        assert rt.logit_bytes_saved + rt.logit_bytes_transient == 12.0, name
    assert load_runtime("megatron").logit_bytes_transient == 4.0  # fused in place: unchanged


def test_the_loss_and_the_blocks_backward_do_not_peak_together() -> None:
    """Without a pipeline the stage holds its kept blocks plus the larger of the loss's peak
    and the working set (the head's backward ends before the last block's starts), not both."""
    model = PRESETS["llama-3-8b"]
    rt = load_runtime("torchtitan")
    plan = plan_from_dict({"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb",
                                                              "num_gpus": 8},
                           "parallel": {"dp": 8}, "zero_stage": 3,
                           "recompute": {"policy": "full"},
                           "batch": {"micro_batch_size": 2, "global_batch_size": 16}})
    r = rows_of(plan_to_row(plan, model), model, "bf16", rt)
    parts = step_memory.activation_parts(model, r, False, rt, "bf16")
    acts = step_memory.stage_activation_bytes(model, r, "bf16", False, rt, parts)
    loss = memory.logits_bytes(model, r.b, r.tp, r.vocab, r.cp, 1.0, 4.0, 8.0)
    assert float(acts.first[0] - acts.ends[0][0]) == pytest.approx(
        max(float(loss[0]), float(acts.working[0])))


# --- ZeRO-1 on FSDP2 with one micro-batch ------------------------------------------------------

def _llama8b_dp8(zero: int, gbs: int, runtime: str):
    plan = plan_from_dict({"model": "llama-3-8b", "cluster": {"profile": "h100-sxm-80gb",
                                                              "num_gpus": 8},
                           "parallel": {"dp": 8}, "zero_stage": zero,
                           "recompute": {"policy": "full"},
                           "batch": {"micro_batch_size": 1, "global_batch_size": gbs}})
    return estimate_plan(plan, runtime=runtime).memory


def test_fsdp2_zero1_with_one_micro_batch_keeps_only_the_gradient_shard() -> None:
    """runtime/trainer.py _sync_context: set_requires_gradient_sync(last or zero >= 2), so with
    one micro-batch ZeRO-1 reduce-scatters per unit as ZeRO-2 does (3.7 GiB of fp32 gradients,
    not 29.9); with two it accumulates whole ones, and Megatron's buffer is whole either way."""
    one = _llama8b_dp8(1, 8, "autoplan-cuda")
    assert one["grads"] == pytest.approx(_llama8b_dp8(2, 8, "autoplan-cuda")["grads"])
    assert one["grads"] / GIB == pytest.approx(3.74, abs=0.05)
    assert _llama8b_dp8(1, 16, "autoplan-cuda")["grads"] == pytest.approx(8 * one["grads"])
    assert _llama8b_dp8(1, 8, "megatron")["grads"] == pytest.approx(8 * one["grads"])


# --- PyTorch ring attention -------------------------------------------------------------------

@pytest.mark.parametrize(("cp", "kv_heads"), [(2, 8), (4, 8), (8, 8), (4, 4), (4, 2)])
def test_torch_ring_attention_gathers_the_whole_sequences_kv(cp, kv_heads) -> None:
    """_templated_ring_attention(_backward) with the all-gather rotater on rank cp - 1 of a fake
    process group (collectives allocate their outputs only, as NCCL's), one thread (the CPU
    flash kernel's buffers grow with threads): forward cp x L + 8 outputs beyond its own,
    backward cp x L + 6.7 Q + 8.5 L (memory.torch_ring_attention_bytes)."""
    import torch.distributed as dist
    from torch.distributed.tensor.experimental._context_parallel import _attention
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=cp - 1, world_size=cp)
    try:
        q = torch.randn(1, 8, 1024, 64, dtype=torch.bfloat16)
        k, v = (torch.randn(1, kv_heads, 1024, 64, dtype=torch.bfloat16) for _ in range(2))
        ops = torch.ops.aten
        out, lse, *_ = _attention._templated_ring_attention(
            dist.group.WORLD, 2, ops._scaled_dot_product_flash_attention_for_cpu, q, k, v,
            is_causal=True)
        grad = torch.randn_like(out)
        forward = _alive(lambda: _attention._templated_ring_attention(
            dist.group.WORLD, 2, ops._scaled_dot_product_flash_attention_for_cpu, q, k, v,
            is_causal=True))[1].max()
        backward = _alive(lambda: _attention._templated_ring_attention_backward(
            dist.group.WORLD, 2, ops._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad, "grad_out", q, k, v, out, lse, True, dropout_p=0.0))[1].max()
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    parts = {"attn_out": np.array(2.0 * q.numel()), "qkv": np.array(2.0 * (q.numel()
                                                                            + 2 * k.numel()))}
    fwd, bwd = memory.torch_ring_attention_bytes(parts, np.array(cp), "bf16")
    kept = out.numel() * 2 + lse.numel() * 4  # the call's output, kept by the block
    assert forward - kept == pytest.approx(float(fwd), rel=0.02)
    assert backward == pytest.approx(float(bwd), rel=0.02)


def test_torchtitan_ring_attention_widens_the_working_set_with_cp() -> None:
    """torchtitan's context parallelism (cp_exchange torch-ring) holds the gathered K/V of the
    whole sequence in each block's attention; torchtitan 0.3's all-gather exchange is priced
    as before."""
    model = PRESETS["llama-3-70b"]

    def working(runtime: str, cp: int) -> float:
        rt = load_runtime(runtime)
        plan = plan_from_dict({"model": "llama-3-70b", "cluster": {"profile": "h100-sxm-80gb",
                                                                   "num_gpus": 64},
                               "parallel": {"dp": 8 // cp, "tp": 8, "cp": cp},
                               "sequence_parallel": True, "zero_stage": 3,
                               "recompute": {"policy": "full"},
                               "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
        spec = model.replace(seq_len=8192 * cp)  # the same local sequence at every cp
        r = rows_of(plan_to_row(plan, spec), spec, "bf16", rt)
        parts = step_memory.activation_parts(spec, r, False, rt, "bf16")
        return float(step_memory.stage_activation_bytes(spec, r, "bf16", False, rt,
                                                        parts).working[0])

    assert working("torchtitan", 8) > working("torchtitan", 2) > working("torchtitan", 1)
    assert working("torchtitan-0.3", 8) == pytest.approx(working("torchtitan-0.3", 1))


# --- buffers ---------------------------------------------------------------------------------

def test_deepspeed_zero2_allocates_its_contiguous_gradient_bucket() -> None:
    """stage_1_and_2.py setup_buckets: reduce_bucket_size (5e8) 16-bit elements under ZeRO-2
    (contiguous_gradients on by default), even on one GPU; DDP's 2 x 25 MiB elsewhere."""
    ds2 = _llama8b_dp8(2, 8, "deepspeed")["buffers"]
    assert ds2 == pytest.approx(5e8 * 2)
    assert _llama8b_dp8(1, 8, "deepspeed")["buffers"] == memory.DDP_BUCKET_BYTES
    assert _llama8b_dp8(2, 8, "autoplan-cuda")["buffers"] == memory.DDP_BUCKET_BYTES


@pytest.mark.parametrize(("runtime", "ep", "experts_in_unit"), [
    ("autoplan-cuda", 1, 8), ("autoplan-cuda", 8, 1), ("torchtitan", 1, 8),
    ("megatron", 8, None)])
def test_zero3_gathers_the_experts_with_or_beside_their_block(runtime, ep,
                                                               experts_in_unit) -> None:
    """Mixtral-8x7B ZeRO-3: at ep 1 FSDP2's block unit holds all 8 experts (1.45B parameters,
    3 gathered copies: 8.1 GiB, where a dense block priced 1.2); with an expert mesh FSDP2
    wraps each layer's E/ep experts apart (autoplan's apply_expert_fsdp, torchtitan's
    apply_fsdp), Megatron-FSDP keeps them in the TransformerLayer unit."""
    from autoplan.cost import params

    model = PRESETS["mixtral-8x7b"]
    plan = plan_from_dict({"model": "mixtral-8x7b", "cluster": {"profile": "h100-sxm-80gb",
                                                                "num_gpus": 8},
                           "parallel": {"dp": 8, "ep": ep}, "zero_stage": 3,
                           "recompute": {"policy": "full"},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 8}})
    buffers = estimate_plan(plan, runtime=runtime).memory["buffers"]
    expert, rest = params.expert_params(model), params.moe_block_rest_params(model)
    embed = float(params.padded_vocab(model)) * model.hidden_size
    unit = rest + 8 * expert / ep if experts_in_unit is None else (
        max(rest, expert) if experts_in_unit == 1 else rest + 8 * expert)
    assert buffers == pytest.approx(3 * 2 * max(unit, embed))
    if (runtime, ep) == ("autoplan-cuda", 1):
        assert buffers / GIB == pytest.approx(8.1, abs=0.1)
