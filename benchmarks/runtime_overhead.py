"""Step time of autoplan's runtime vs plain PyTorch on the same model and data.

1 process: the runtime (parallelize + Trainer, world size 1) vs a plain loop
(forward, cross entropy, backward, AdamW step). 2 ranks: the runtime's ZeRO-0 data parallelism
vs a hand-written torch DDP loop. Targets: <= 1.05x and <= 1.10x. Prints; asserts nothing.

    OMP_NUM_THREADS=1 python benchmarks/runtime_overhead.py [--steps 30] [--model tiny]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as tmp  # noqa: E402

from autoplan.model_spec import load_model  # noqa: E402
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision  # noqa: E402

WARMUP = 3
ROUNDS = 3


def _plan(model: str, dp: int, gbs: int) -> Plan:
    return Plan(model=model, cluster=ClusterRef("cpu-gloo", dp), parallel=Parallel(dp=dp),
                batch=Batch(micro_batch_size=gbs // dp, global_batch_size=gbs),
                precision=Precision.FP32)


def _batches(spec, plan: Plan, steps: int, dp_rank: int):
    from autoplan.runtime.data import SyntheticTokens, local_batch

    src = SyntheticTokens(spec.vocab_size, spec.seq_len)
    return [local_batch(src, s, plan.batch.global_batch_size, plan.parallel.dp, dp_rank)
            for s in range(1, steps + 1)]


def _plain_step(model, opt, x, y):
    from autoplan.runtime.parallelize import cross_entropy

    loss = cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _time(fn, batches) -> float:
    times = []
    for x, y in batches:
        t0 = time.perf_counter()
        fn(x, y)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:])


def _rank(rank: int, world: int, store_path: str, model: str, steps: int, out) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from autoplan.runtime.mesh import ParallelDims, build_mesh
    from autoplan.runtime.models.init import materialize_and_init
    from autoplan.runtime.models.transformer import build_meta_model
    from autoplan.runtime.optim import OptimConfig, build_optimizer
    from autoplan.runtime.parallelize import RuntimeOptions, parallelize
    from autoplan.runtime.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    spec = load_model(model)
    plan = _plan(model, world, 8 * world)
    batches = _batches(spec, plan, steps, rank)
    cfg = OptimConfig(lr=1e-3)

    plain = build_meta_model(spec)
    materialize_and_init(plain, torch.device("cpu"), spec.num_layers, seed=0,
                         tied=spec.tie_embeddings)  # the same model the runtime builds
    if world > 1:
        plain = DistributedDataParallel(plain)
    opt = build_optimizer(plain, cfg)
    dims = ParallelDims.from_plan(plan)
    pm = parallelize(plan, spec, build_mesh(dims, "cpu"), torch.device("cpu"), RuntimeOptions())
    trainer = Trainer(pm, cfg, reseed=False)
    t_plain, t_runtime = [], []
    for _ in range(ROUNDS):  # alternate, so load from other processes hits both alike
        t_plain.append(_time(lambda x, y: _plain_step(plain, opt, x, y), batches))
        t_runtime.append(_time(lambda x, y: trainer.train_step(x, y), batches))
    t_plain, t_runtime = min(t_plain), min(t_runtime)
    if rank == 0:
        out.put((t_plain, t_runtime))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def measure(world: int, model: str, steps: int) -> tuple[float, float]:
    import multiprocessing as mp

    fd, store = tempfile.mkstemp(prefix="autoplan-bench-")
    os.close(fd)
    os.unlink(store)
    q = mp.get_context("fork").Queue()
    ctx = tmp.start_processes(_rank, args=(world, store, model, steps, q), nprocs=world,
                              join=False, start_method="fork")
    result = q.get(timeout=600)
    ctx.join(timeout=60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    print(f"model {args.model}: best of {ROUNDS} alternating rounds, each the median of "
          f"{args.steps} steps after {WARMUP} warm-up; "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print(f"{'setting':<28}{'baseline ms':>12}{'runtime ms':>12}{'ratio':>8}{'target':>8}")
    for world, name, target in ((1, "1 process vs plain loop", 1.05),
                                (2, "2 ranks vs torch DDP", 1.10)):
        base, ours = measure(world, args.model, args.steps)
        print(f"{name:<28}{base * 1e3:>12.2f}{ours * 1e3:>12.2f}{ours / base:>8.3f}"
              f"{target:>8.2f}")


if __name__ == "__main__":
    main()
