"""The tensor-parallel collectives the cost model prices (comm.TP_CALLS) are the runtime's: one
micro-batch of the tiny model at tp 2, with and without sequence parallelism and recompute,
through the trainer's own forward and backward over torch's fake process group, its
collectives counted by kind and message size."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import pytest

from autoplan.cost import comm
from autoplan.model_spec import PRESETS, NormKind
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision, Recompute, RecomputePolicy

torch = pytest.importorskip("torch")

KINDS = {"all_reduce": comm.ALL_REDUCE, "all_gather_into_tensor": comm.ALL_GATHER,
         "reduce_scatter_tensor": comm.REDUCE_SCATTER}
"""torch's functional collectives (what DTensor issues) by the cost model's kind names."""
B, TP = 2, 2


def _runtime_calls(plan: Plan) -> Counter:
    """(kind, elements of the call's input) -> calls of one micro-batch's forward and backward
    and of the step's partial-gradient sum (Trainer.train_step's reduce_partial_grads)."""
    import math

    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoplan.runtime.mesh import ParallelDims, build_mesh
    from autoplan.runtime.optim import OptimConfig, reduce_partial_grads
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer

    spec = plan.model_spec()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=TP)
    try:
        pm = parallelize(plan, spec, build_mesh(ParallelDims.from_plan(plan), "cpu"),
                         torch.device("cpu"), RuntimeOptions())
        trainer = Trainer(pm, OptimConfig(name="sgd", lr=0.0))
        tokens = torch.randint(0, spec.vocab_size, (B, spec.seq_len + 1))
        # the profiler, not a dispatch mode: DTensor's loss-parallel cross entropy issues its
        # all-reduces inside its own dispatch, where a mode above it does not see them
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            trainer.forward_backward(tokens[:, :-1], tokens[:, 1:])
            reduce_partial_grads(pm.parts)
    finally:
        dist.destroy_process_group()
    # only calls that reach the process group (a c10d:: op beneath them) communicate: under
    # selective recompute the caching mode re-dispatches each op it sees (a second, nested event
    # of the same op), and in backward returns the saved outputs of the ops it kept without
    # calling the group (an event with no c10d:: op beneath it)
    calls: Counter = Counter()
    for event in prof.events():
        namespace, _, name = event.name.partition("::")
        if namespace == "_c10d_functional" and name in KINDS and any(
                child.name.startswith("c10d::") for child in event.cpu_children):
            calls[(KINDS[name], math.prod(event.input_shapes[0]))] += 1
    return calls


def _priced_calls(plan: Plan) -> Counter:
    """The same count from the cost model's tables: each block's and the recompute's calls
    (comm.TP_CALLS), the embedding's and head's, the loss's, and the norms' partial gradients
    (step_time: per norm tensor, each block's two and the final one, under sequence
    parallelism)."""
    spec = plan.model_spec()
    sp = plan.sequence_parallel
    act, tokens = B * spec.seq_len * spec.hidden_size, B * spec.seq_len
    parts = {"layer": spec.num_layers, "embedding": 1, "head": 1}
    if plan.recompute.policy is not RecomputePolicy.NONE:
        parts[f"recompute_{plan.recompute.policy.value}"] = spec.num_layers
    out: Counter = Counter()
    for part, blocks in parts.items():
        for kind, n in comm.TP_CALLS[part][sp].items():
            # an all-gather's input is one rank's shard of the message
            out[(kind, act // TP if kind == comm.ALL_GATHER else act)] += n * blocks
    out[(comm.ALL_REDUCE, tokens)] += comm.LOSS_ALL_REDUCES
    if sp:
        per_norm = 2 if spec.norm is NormKind.LAYERNORM else 1
        out[(comm.ALL_REDUCE, spec.hidden_size)] += per_norm * (2 * spec.num_layers + 1)
    return out


CASES = [(model, sp, policy) for model in ("tiny", "tiny-llama") for sp in (False, True)
         for policy in (RecomputePolicy.NONE, RecomputePolicy.FULL)] + [
    ("tiny", sp, RecomputePolicy.SELECTIVE) for sp in (False, True)]


@pytest.mark.parametrize(("model", "sp", "policy"), CASES)
def test_tensor_parallel_collectives_are_the_runtimes(model, sp, policy) -> None:
    """Sequence parallelism doubles the calls (an all-gather and a reduce-scatter where an
    all-reduce was) and adds the embedding gradient's gather and the norms' partial sums: the
    calls a CPU step at tp 2 spends most of its communication time in (each about the same
    seconds whatever its kind, tests/unit/profiler/test_collectives.py), so each counts."""
    plan = Plan(model=model, cluster=ClusterRef("cpu-gloo", TP), batch=Batch(B, B),
                parallel=Parallel(tp=TP), sequence_parallel=sp, precision=Precision.FP32,
                recompute=Recompute(policy))
    assert PRESETS[model].seq_len % TP == 0
    # spawned: a fake process group's mesh leaves state that the dist tests' ranks would inherit
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        calls = ex.submit(_runtime_calls, plan).result(timeout=300)
    assert calls == _priced_calls(plan)
