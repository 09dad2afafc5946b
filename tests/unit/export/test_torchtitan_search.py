"""`search --runtime torchtitan` (0.2.2, TOML) and `--runtime torchtitan-0.3` (Python config)
keep to plans `export --to torchtitan` writes in that format: the shared runtime rules refuse
what each release runs otherwise than planned (0.2.2: bf16 without FSDP, tp without sequence
parallelism; 0.3.0: checkpointing every n-th block, which only 0.2.2's selective_ac_option
has)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoplan.commands import build_parser
from autoplan.cost.runtime_rules import refusals
from autoplan.cost.runtimes import load_runtime
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.plan import plan_from_dict
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.output import plans

SPACE = """\
schema_version: 1
name: tt-knobs
description: torchtitan's knobs beside the ones each release runs otherwise than planned
parallel: {dp: null, tp: [1, 2, 8], pp: [1, 2], cp: [1, 2]}
sequence_parallel: [false, true]
pipeline: {schedule: [1f1b, interleaved-1f1b], vpp: [1, 2], split: [even]}
zero_stage: [0, 2, 3]
offload: {optimizer: [false], params: [false]}
recompute: {policy: [none, selective, full], num_layers: [null, 1, 4]}
micro_batch_size: [1, 2]
precision: [bf16, fp32]
attention: flash
"""


@pytest.mark.parametrize(("runtime", "fmt"), [("torchtitan", "toml"),
                                              ("torchtitan-0.3", "python")])
def test_every_plan_a_torchtitan_search_offers_exports(tmp_path: Path, runtime: str,
                                                       fmt: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    args = build_parser().parse_args(
        ["search", "--model", "llama-3.1-8b", "--cluster", "h100-sxm-80gb", "--num-gpus", "8",
         "--global-batch-size", "64", "--runtime", runtime, "--space", str(space)])
    res = run_search(build_request(args))
    offered = plans(res, np.flatnonzero(res.scored.feasible))
    assert len(offered) >= 100
    refused = []
    for p in offered:
        try:
            export_plan(get_target("torchtitan"), p, p.model_spec(),
                        ExportOptions(torchtitan_format=fmt))
        except ConfigError as err:
            refused.append(str(err))
    assert not refused, f"{len(refused)} of {len(offered)}: {refused[0]}"


def _plan(**fields):
    return plan_from_dict({"model": "llama-3.1-8b",
                           "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 8},
                           "batch": {"micro_batch_size": 1, "global_batch_size": 64},
                           **fields})


@pytest.mark.parametrize(("fields", "old", "new"), [
    # bf16 beside tp without FSDP: 0.2.2 trains it in fp32, 0.3.0 wraps every model in FSDP
    ({"parallel": {"dp": 1, "tp": 8}, "sequence_parallel": True, "precision": "bf16"},
     "only through FSDP", None),
    ({"parallel": {"dp": 8}, "zero_stage": 0, "precision": "bf16"}, "only through FSDP", None),
    ({"parallel": {"dp": 4, "tp": 2}, "zero_stage": 2, "sequence_parallel": False,
      "precision": "bf16"}, "shards the norms over tp", None),
    # every 4th block (8 of 32 checkpointed), which only 0.2.2's selective_ac_option says
    ({"parallel": {"dp": 8}, "zero_stage": 3, "precision": "bf16",
      "recompute": {"policy": "full", "num_layers": 8}}, None, "every block or none"),
])
def test_each_torchtitan_release_refuses_what_it_runs_otherwise(fields, old, new) -> None:
    plan = _plan(**fields)
    for runtime, needle in (("torchtitan", old), ("torchtitan-0.3", new)):
        got = refusals(plan, load_runtime(runtime), plan.model_spec())
        if needle is None:
            assert got == [], (runtime, got)
        else:
            assert any(needle in r for r in got), (runtime, got)
