"""How fast is the exhaustive search? Prints candidates generated and scored, seconds and
candidates/s for the acceptance search (gpt3-175b, 1024 x A100-80GB, global batch 1536, default
space), end to end through the CLI code path (request, enumerate, rules, score, rank, summary),
plus a per-stage profile. Run: python benchmarks/search_speed.py [--repeat 3]"""

from __future__ import annotations

import argparse
import json
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

ARGS = ["search", "--model", "gpt3-175b", "--cluster", "a100-sxm4-80gb", "--num-gpus", "1024",
        "--global-batch-size", "1536"]


def stages(req) -> dict[str, float]:  # type: ignore[no-untyped-def]
    t = {}
    t0 = time.perf_counter()
    enum = enumerate_space(req.space, req.model, req.gpu_counts, req.global_batch_size)
    t["enumerate"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    scored = score_table(enum.table, req.context(), counts={"world-size": 0})
    t["rules + estimate + targets"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rank(scored, req.targets)
    t["rank"] = time.perf_counter() - t0
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    args = build_parser().parse_args(ARGS)
    req = build_request(args)
    best = None
    for _ in range(opts.repeat):
        t0 = time.perf_counter()
        result = run_search(req)
        data = summary(result, 10)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "autoplan.commands", *ARGS, "--format", "json"],
                          capture_output=True, text=True, check=True)
    process = time.perf_counter() - t0
    in_process = json.loads(proc.stdout)["seconds"]
    print(f"search: {' '.join(ARGS[1:])}")
    print(f"{'candidates generated':>28}: {result.total:,}")
    print(f"{'candidates scored':>28}: {result.scored.n:,} (passed the rules)")
    print(f"{'feasible':>28}: {data['feasible_count']:,}")
    print(f"{'seconds (best of ' + str(opts.repeat) + ')':>28}: {best:.3f}")
    print(f"{'candidates/s':>28}: {result.total / best:,.0f} generated, "
          f"{result.scored.n / best:,.0f} scored")
    print(f"{'CLI process end to end':>28}: {process:.3f} s (search itself {in_process:.3f} s; "
          "the rest is interpreter start, imports, rendering JSON)")
    for name, sec in stages(req).items():
        print(f"{'  ' + name:>28}: {sec:.3f} s")
    c = result.scored.cols
    i = result.best
    print(f"winner: dp={c['dp'][i]} tp={c['tp'][i]} pp={c['pp'][i]} cp={c['cp'][i]} "
          f"sp={bool(c['sp'][i])} mbs={c['mbs'][i]} {c['tokens_per_s'][i]:,.0f} tokens/s "
          f"MFU {c['mfu'][i]:.1%} {c['mem_total'][i] / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
