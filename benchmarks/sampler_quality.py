"""How good are the Optuna samplers? On spaces small enough to enumerate, compare the best plan
Optuna finds after N trials with the exhaustive optimum, over 10 seeds, and print a table:
best/optimum at 100, 200 and 300 trials, and the trials needed to come within 3%.

Optuna samples the same knobs as the exhaustive search (the even layer split only, so the two
searches cover exactly the same plans); one trial is one layout (GPUs, tp/pp/cp, schedule, vpp,
micro-batch) whose memory-saving knobs are scored together inside the trial (trial_space.py). Target: within 3% in <= 300 trials for >= 9 of 10 seeds.
Run: python benchmarks/sampler_quality.py [--trials 300] [--seeds 10] [--sampler tpe]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.search.engine import SearchRequest, run_search
from autoplan.search_space import PipelineSpace, Split, load_space

CASES = [  # model, profile, GPUs, global batch, space
    ("gpt3-175b", "a100-sxm4-80gb", 1024, 1536, "default"),
    ("gpt3-13b", "a100-sxm4-80gb", 64, 512, "default"),
    ("llama-2-70b", "h100-sxm-80gb", 256, 1024, "default"),
    ("tiny", "cpu-gloo", 8, 16, "small-cpu"),
]
TOL = 0.03


def request(model: str, profile: str, gpus: int, gbs: int, space: str) -> SearchRequest:
    sp = load_space(space)
    sp = dataclasses.replace(sp, pipeline=PipelineSpace(sp.pipeline.schedule, sp.pipeline.vpp,
                                                        (Split.EVEN,)))
    return SearchRequest(load_model(model), model, load_profile(profile), profile, sp, (gpus,),
                         gbs)


def best_so_far(result, trials: int) -> np.ndarray:
    """Best tokens/s after each trial (0 until a feasible one)."""
    c = result.scored.cols
    best = np.zeros(trials)
    feas = result.scored.feasible
    for t, v in zip(c["seq"][feas], c["tokens_per_s"][feas], strict=True):
        best[int(t):] = np.maximum(best[int(t):], v)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "nsga2", "random"))
    ap.add_argument("--cases", type=int, default=len(CASES), help="first N cases only")
    opts = ap.parse_args()
    checkpoints = [c for c in (100, 200, 300, opts.trials) if c <= opts.trials]
    checkpoints = sorted(set(checkpoints))
    header = (f"{'case':<40} {'seed':>4} " + " ".join(f"{'@' + str(c):>7}" for c in checkpoints)
              + f" {'to 3%':>6} {'s':>6}")
    print(f"sampler {opts.sampler}, {opts.trials} trials, {opts.seeds} seeds; "
          "columns: best found / exhaustive optimum (tokens/s)")
    print(header)
    summary = []
    for case in CASES[:opts.cases]:
        req = request(*case)
        ex = run_search(dataclasses.replace(req, sampler="exhaustive"))
        optimum = float(ex.scored.cols["tokens_per_s"][ex.best])
        name = f"{case[0]} x{case[2]} {case[1]} ({ex.total:,})"
        hits, needed = 0, []
        for seed in range(opts.seeds):
            t0 = time.perf_counter()
            res = run_search(dataclasses.replace(req, sampler=opts.sampler, trials=opts.trials,
                                                 seed=seed))
            curve = best_so_far(res, opts.trials) / optimum
            within = np.flatnonzero(curve >= 1.0 - TOL)
            first = int(within[0]) + 1 if len(within) else None
            hits += first is not None
            if first is not None:
                needed.append(first)
            cells = " ".join(f"{curve[c - 1]:>7.4f}" for c in checkpoints)
            print(f"{name:<40} {seed:>4} {cells} {first if first else '-':>6} "
                  f"{time.perf_counter() - t0:>6.1f}", flush=True)
        summary.append((name, hits, int(np.median(needed)) if needed else None))
    print()
    print(f"{'case':<40} {'seeds within 3%':>16} {'median trials':>14}")
    for name, hits, med in summary:
        mark = "ok" if hits >= 0.9 * opts.seeds else "MISS"
        print(f"{name:<40} {f'{hits}/{opts.seeds}':>16} {med if med else '-':>14}  {mark}")


if __name__ == "__main__":
    main()
