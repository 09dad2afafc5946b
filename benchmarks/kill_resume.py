"""Kill `autoplan train` N times at random steps (Ctrl-C, SIGTERM, or kill -9 of one rank) and
check each time what issue #14 asks: no live process left, no temporary checkpoint, a metrics
file with each step exactly once, and the resumed run's final loss equal to an uninterrupted
run's (bitwise). Prints the outcome counts; exits 1 if any run failed a check.

    OMP_NUM_THREADS=1 python benchmarks/kill_resume.py [-n 20] [--steps 12] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.dist.interrupt

from autoplan.plan_files import save_plan  # noqa: E402
from tests.dist.interrupt import KINDS, interrupt_and_resume, reference_loss  # noqa: E402
from tests.dist.parity import make_plan  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="interrupted runs")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=2, help="--checkpoint-every")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    counts: collections.Counter[str] = collections.Counter()
    by_kind: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="kill-resume-") as tmp:
        root = Path(tmp)
        plan = str(save_plan(make_plan(dp=2, zero=2), root / "plan.yaml"))
        ref = reference_loss(plan, args.steps, root)
        print(f"uninterrupted: final loss {ref!r} after {args.steps} steps", flush=True)
        for i in range(args.n):
            kind, at = rng.choice(KINDS), rng.randint(1, args.steps - 1)
            start = time.monotonic()
            res = interrupt_and_resume(plan, args.steps, root / f"run{i:02d}", kind, at,
                                       args.every)
            problems = res.problems(args.steps, ref)
            counts["ok" if not problems else "failed"] += 1
            by_kind[f"{kind} {'ok' if not problems else 'failed'}"] += 1
            for p in problems:
                counts[p.split(" [")[0].split(" 0")[0][:40]] += 1
            print(f"{i + 1:3d}/{args.n} {kind:7} at step {at:2d}: exit {res.codes} "
                  f"{'ok' if not problems else '; '.join(problems)} "
                  f"({time.monotonic() - start:.0f} s)", flush=True)
    print("outcomes:", dict(counts))
    print("by kind: ", dict(sorted(by_kind.items())))
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
