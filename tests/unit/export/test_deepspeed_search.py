"""`search --runtime deepspeed` keeps to plans `export --to deepspeed` writes: the deepspeed
runtime traits offer no recompute the exporter refuses (a layer count per stage; selective
without tensor or pipeline parallelism, where no Megatron model code comes with it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autoplan.commands import build_parser
from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.output import plans

SPACE = """\
schema_version: 1
name: ds-recompute
description: the recompute knobs beside plain ZeRO and Megatron-DeepSpeed 3D
parallel: {dp: null, tp: [1, 2], pp: [1, 2], cp: [1]}
sequence_parallel: [false, true]
pipeline: {schedule: [1f1b], vpp: [1], split: [even]}
zero_stage: [0, 1, 2, 3]
offload: {optimizer: [false], params: [false]}
recompute: {policy: [none, selective, full], num_layers: [null, 1, 2]}
micro_batch_size: [1, 2]
precision: bf16
attention: flash
"""


def test_every_plan_a_deepspeed_search_offers_exports(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    args = build_parser().parse_args(
        ["search", "--model", "gpt3-1.3b", "--cluster", "h100-sxm-80gb", "--num-gpus", "8",
         "--global-batch-size", "64", "--runtime", "deepspeed", "--space", str(space)])
    res = run_search(build_request(args))
    offered = plans(res, np.flatnonzero(res.scored.feasible))
    assert len(offered) >= 20
    policies = {(p.recompute.policy.value, p.parallel.tp > 1 or p.parallel.pp > 1)
                for p in offered}
    # selective only in Megatron-DeepSpeed's 3D plans
    assert ("selective", True) in policies and ("selective", False) not in policies
    refused = []
    for p in offered:
        try:
            export_plan(get_target("deepspeed"), p, p.model_spec(), ExportOptions())
        except ConfigError as err:
            refused.append(str(err))
    assert not refused, f"{len(refused)} of {len(offered)}: {refused[0]}"
