"""How much of a practitioner row's price survives being written in the published schema.

A file of runs from elsewhere comes in tests/data/published/published-open.yaml's schema, which
carries a framework's name, a GPU's name and a model's shape, not the runtime traits, layer
split or architecture details a practitioner row (benchmarks/practitioner.py) states from its
source. This script writes every dense configuration of the practitioner set and its sweeps in
that schema (the framework named for the row's runtime, the GPU for its profile, the parameter
count rounded to 0.1B, the measured step as iteration_time_s), reads it back the way
`published_accuracy.py --data` does (published_schema.py) and prints, per source, the mean
absolute error of the hand-built rows and of the rows read back, and how many of them price the
same (within 0.5%). What differs is what the schema cannot say.

Run: python benchmarks/schema_fidelity.py [--format table|json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import practitioner  # noqa: E402
import published_accuracy  # noqa: E402
from published_accuracy import SWEEPS  # noqa: E402

from autoplan.cost.params import total_params  # noqa: E402

FRAMEWORKS = {"torchtitan": "torchtitan", "nemo": "NeMo", "megatron": "Megatron-LM",
              "deepspeed": "Megatron-DeepSpeed", "llm-foundry": "MosaicML llm-foundry",
              "nanotron": "nanotron"}
"""The framework each runtime preset's rows name (published_schema.runtime_of reads them back,
Megatron-LM by the year of the row's source)."""
GPUS = {"h100-sxm-80gb": ("H100-SXM5-80GB", ""), "h100-96gb-500w": ("H100-SXM5-96GB", ""),
        "h200-sxm-141gb": ("H200-SXM-141GB", ""), "a100-sxm4-80gb": ("A100-SXM4-80GB", ""),
        "a100-sxm4-40gb": ("A100-SXM4-40GB", ""), "v100-sxm2-32gb": ("V100-SXM2-32GB", ""),
        "a100-80gb-opa": ("A100-SXM4-80GB", "Omni-Path 100 Gb/s x 4")}
"""Each profile's GPU as a paper names it, with the interconnect where that picks the profile."""


def as_published(entry: dict) -> dict | None:
    """The entry as a run of the published schema; None for a MoE model, an unscored row, one
    without a measured step, or one on a profile GPUS does not name."""
    plan, model, cluster = practitioner.build(entry)
    if model.moe is not None or entry["runtime"] not in FRAMEWORKS \
            or cluster.profile.name not in GPUS:
        return None
    if not entry.get("scored", True) or not entry["measured"].get("step_time_s"):
        return None
    p, gpu = plan.parallel, GPUS[cluster.profile.name]
    return {
        "id": entry["id"], "framework": FRAMEWORKS[entry["runtime"]],
        "source": f"{entry['source']['title']} ({entry['source'].get('year')})",
        "source_id": practitioner.source_id(entry), "test_quality": "complete",
        "precision": plan.precision.value,
        "model": {"params": round(total_params(model) / 1e9, 1), "layers": model.num_layers,
                  "hidden": model.hidden_size, "heads": model.num_heads,
                  "kv_heads": model.num_kv_heads, "ffn_hidden": model.ffn_hidden_size,
                  "seq_len": model.seq_len, "vocab": model.vocab_size},
        "cluster": {"gpu": gpu[0], "gpus": cluster.num_gpus, "interconnect": gpu[1]},
        "plan": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "vpp": plan.pipeline.vpp,
                 "sp": plan.sequence_parallel, "zero_stage": plan.zero_stage,
                 "offload": plan.offload.optimizer, "recompute": plan.recompute.policy.value,
                 "micro_batch": plan.batch.micro_batch_size,
                 "global_batch": plan.batch.global_batch_size},
        "measured": {"iteration_time_s": entry["measured"]["step_time_s"]},
    }


def compare(paths: tuple[Path, ...] = (practitioner.DEFAULT_DATA, *SWEEPS)) -> list[dict]:
    """Per row of the data files `paths`: the hand-built price and the one read back from the
    schema (None where the reading lists the run, with its reason)."""
    out = []
    for path in paths:
        for index, entry in enumerate(practitioner.load_data(path)):
            run = as_published(entry)
            if run is None:
                continue
            hand = practitioner.score_entry(entry)
            row, skipped = published_accuracy._read_one(run, index)
            out.append({"id": entry["id"], "source": run["source_id"],
                        "hand_error": hand["error"],
                        "read_error": None if row is None else row["error"],
                        "listed": None if skipped is None else skipped["reason"]})
    return out


def summary(rows: list[dict]) -> dict[str, dict]:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["source"]].append(r)
    by["all"] = rows
    out = {}
    for source, members in by.items():
        read = [r for r in members if r["read_error"] is not None]
        out[source] = {
            "rows": len(members), "read": len(read),
            "hand_mape": sum(abs(r["hand_error"]) for r in read) / len(read) if read else None,
            "read_mape": sum(abs(r["read_error"]) for r in read) / len(read) if read else None,
            "same_price": sum(abs((1 + r["read_error"]) / (1 + r["hand_error"]) - 1) <= 0.005
                              for r in read)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("table", "json"), default="table")
    args = ap.parse_args(argv)
    rows = compare()
    stats = summary(rows)
    if args.format == "json":
        print(json.dumps({"rows": rows, "summary": stats}, indent=2))
        return 0
    print(f"{'source':38} {'rows':>4} {'read':>4} {'hand MAPE':>9} {'read MAPE':>9} "
          f"{'same price':>10}")
    for source, s in stats.items():
        hand = "-" if s["hand_mape"] is None else f"{s['hand_mape']:.1%}"
        read = "-" if s["read_mape"] is None else f"{s['read_mape']:.1%}"
        print(f"{source[:38]:38} {s['rows']:>4} {s['read']:>4} {hand:>9} {read:>9} "
              f"{s['same_price']:>10}")
    for r in rows:
        if r["listed"]:
            print(f"  listed: {r['id']}: {r['listed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
