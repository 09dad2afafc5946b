"""How fast is the exhaustive search? For the two acceptance searches of issue #12 (gpt3-175b on
1024 x A100-80GB, budget 2 s; llama-3.1-405b on 16,384 x H100, budget 10 s; default space),
prints candidates generated and scored, the median wall and CPU seconds of the search end to end
as the CLI runs it (request, enumerate, rules, score, rank, summary), a CLI process timing, and a
per-stage profile. Wall time on a shared machine includes other jobs; CPU time does not.
Run: python benchmarks/search_speed.py [--repeat 5] [--only 175b|405b]"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from autoplan.commands import build_parser
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.output import summary
from autoplan.search.ranking import rank
from autoplan.search.scoring import score_table
from autoplan.search.space import enumerate_space

CASES = {
    "175b": (["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus",
              "1024", "--global-batch-size", "1536"], 2.0),
    "405b": (["search", "--model", "llama-3.1-405b", "--cluster", "h100-sxm-80gb",
              "--num-gpus", "16384", "--global-batch-size", "2048"], 10.0),
}


def stages(req) -> dict[str, float]:  # type: ignore[no-untyped-def]
    t = {}
    t0 = time.perf_counter()
    enum = enumerate_space(req.space, req.model, req.gpu_counts, req.global_batch_size)
    t["enumerate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scored = score_table(enum.table, req.context(),
                         counts={"world-size": 0, **enum.precounted})
    t["rules + estimate + targets"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rank(scored, req.targets)
    t["rank"] = time.perf_counter() - t0
    return t


def measure(argv: list[str], budget: float, repeat: int) -> None:
    req = build_request(build_parser().parse_args(argv))
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_search(req)
        data = summary(result, 10)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autoplan.commands", *argv, "--format", "json"],
                          capture_output=True, text=True, check=True)
    process = time.perf_counter() - t0
    in_process = json.loads(proc.stdout)["seconds"]
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"search: {' '.join(argv[1:])}")
    print(f"{'candidates generated':>28}: {result.total:,}")
    print(f"{'candidates scored':>28}: {result.scored.n:,} (passed the rules)")
    print(f"{'feasible':>28}: {data['feasible_count']:,}")
    print(f"{'median of ' + str(repeat) + ' (wall)':>28}: {wall:.3f} s "
          f"(min {min(walls):.3f}, max {max(walls):.3f}); budget {budget:g} s")
    print(f"{'median of ' + str(repeat) + ' (CPU)':>28}: {cpu:.3f} s")
    print(f"{'candidates/s':>28}: {result.total / wall:,.0f} generated, "
          f"{result.scored.n / wall:,.0f} scored")
    print(f"{'CLI process end to end':>28}: {process:.3f} s (search itself {in_process:.3f} s; "
          "the rest is interpreter start, imports, rendering JSON)")
    for name, sec in stages(req).items():
        print(f"{'  ' + name:>28}: {sec:.3f} s")
    c = result.scored.cols
    i = result.best
    print(f"winner: dp={c['dp'][i]} tp={c['tp'][i]} pp={c['pp'][i]} cp={c['cp'][i]} "
          f"vpp={c['vpp'][i]} split={c['split'][i]} sp={bool(c['sp'][i])} mbs={c['mbs'][i]} "
          f"{c['tokens_per_s'][i]:,.0f} tokens/s MFU {c['mfu'][i]:.1%} "
          f"{c['mem_total'][i] / 2**30:.1f} GiB\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=sorted(CASES))
    opts = ap.parse_args()
    for name, (argv, budget) in CASES.items():
        if opts.only in (None, name):
            measure(argv, budget, opts.repeat)


if __name__ == "__main__":
    main()
