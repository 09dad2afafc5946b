"""Run the CLI fuzzer of tests/unit/test_fuzz_cli.py for many seeds and count the outcomes.

    python benchmarks/fuzz_cli.py [--cases 10000] [--start 0] [--subprocess 50]

Each case runs `autoplan.commands.main(argv)` in-process in a fresh temporary directory; a
sample also runs through a real `python -m autoplan.commands` process. Prints the count by
outcome (ok / bad-input / infeasible) and every case that broke the CLI contract (a traceback,
another exit code, several stderr lines, files written by a failing command, invalid JSON),
with the argv that reproduces it. Exit code 1 when any case broke it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.fuzz_cli_cases import generate  # noqa: E402 - after the path is set
from tests.unit.test_fuzz_cli import (  # noqa: E402
    classify,
    describe,
    run_case,
    run_case_subprocess,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="in-process cases")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--subprocess", type=int, default=50,
                        help="cases also run through a real process (every Nth seed)")
    args = parser.parse_args(argv)
    import numpy as np

    np.seterr(all="ignore")
    counts: Counter[str] = Counter()
    by_command: Counter[str] = Counter()
    broken: list[str] = []
    started = time.perf_counter()
    step = max(1, args.cases // max(1, args.subprocess)) if args.subprocess else 0
    with tempfile.TemporaryDirectory(prefix="autoplan-fuzz-") as tmp:
        for n, seed in enumerate(range(args.start, args.start + args.cases)):
            case = generate(seed)
            kind, problems = classify(case, run_case(case, Path(tmp) / f"c{seed}"))
            counts[kind] += 1
            by_command[f"{case.argv[0] if case.argv else '-'} {kind}"] += 1
            if problems:
                counts["broken"] += 1
                broken.append(f"seed {seed}: {describe(case, problems)}")
            if step and n % step == 0:
                kind, problems = classify(case, run_case_subprocess(case, Path(tmp) / f"s{seed}"))
                counts["subprocess"] += 1
                if problems:
                    counts["broken"] += 1
                    broken.append(f"seed {seed} (subprocess): {describe(case, problems)}")
            if (n + 1) % 1000 == 0:
                print(f"... {n + 1} cases, {time.perf_counter() - started:.0f} s", flush=True)
    elapsed = time.perf_counter() - started
    print(f"\n{args.cases} in-process cases (seeds {args.start}..{args.start + args.cases - 1}) "
          f"+ {counts['subprocess']} through a real process, {elapsed:.0f} s")
    print(f"{'outcome':<24}{'cases':>8}")
    for kind in ("ok", "bad-input", "infeasible", "other", "broken"):
        print(f"{kind:<24}{counts[kind]:>8}")
    print("\nby command:")
    for key, n in sorted(by_command.items()):
        print(f"  {key:<30}{n:>8}")
    for line in broken:
        print(line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
