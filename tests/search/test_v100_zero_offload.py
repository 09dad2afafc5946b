"""Issue #12 acceptance: GPT-3 13B on one 32 GB V100 with the default space, in fp16.

ZeRO-Offload (Ren et al. 2021, USENIX ATC, section 1 and Figure 7) trains a 13B model on one
V100 by keeping the fp16 weights on the GPU, streaming gradients to the host and stepping the
fp32 master weights and Adam there: ZeRO-2 with the optimizer offloaded. DeepSpeed runs it;
autoplan's own runtime cannot, because its optimizer offload sits on FSDP2 shards that stay fp32
on the device (runtime/offload.py, runtime/data_parallel.py): 4 bytes x 12.9e9 parameters is
48 GiB before anything else. These tests hold both sides: the default runtime rejects the plan
for that memory (not for a rule), and `--runtime deepspeed` finds it and exports it.
"""

from __future__ import annotations

import json

import numpy as np

from autoplan.commands import build_parser
from autoplan.cost.params import total_params
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.registry import get_target
from autoplan.plan import Precision
from autoplan.search.cli import build_request
from autoplan.search.engine import run_search
from autoplan.search.output import plans
from autoplan.search.targets import MISS_KEYS

JOB = ["search", "--model", "gpt3-13b", "--cluster", "v100-sxm2-32gb", "--num-gpus", "1",
       "--global-batch-size", "32"]


def _search(extra: list[str]):
    return run_search(build_request(build_parser().parse_args(JOB + extra)))


def _zero_offload(cols: dict[str, np.ndarray]) -> np.ndarray:
    """ZeRO-Offload rows: ZeRO-2, optimizer on the host, parameters on the device."""
    return (cols["zero_stage"] == 2) & cols["offload_optimizer"].astype(bool) \
        & ~cols["offload_params"].astype(bool)


def test_default_runtime_rejects_zero_offload_for_its_fp32_device_shard() -> None:
    res = _search([])
    assert res.scored.runtime == "autoplan-cuda"
    assert res.request.space.precision == (Precision.FP16,)
    c = res.scored.cols
    zo = _zero_offload(c)
    assert zo.any()  # scored, so no plan rule and no runtime refusal removed it
    assert (c["reason"][zo] == MISS_KEYS.index("out-of-memory")).all()
    n_params = total_params(res.request.model)
    assert (c["mem_params"][zo] >= 4.0 * n_params).all()  # the fp32 FSDP2 shard
    assert (4.0 * n_params > res.request.profile.device.memory_bytes)
    # what autoplan's runtime can run instead: fp16 with the parameters offloaded as well
    best = plans(res, np.array([res.best]))[0]
    assert best.precision is Precision.FP16 and best.offload.params and best.zero_stage == 3


def test_deepspeed_runtime_finds_zero_offload_in_fp16_and_it_exports() -> None:
    res = _search(["--runtime", "deepspeed"])
    assert res.scored.runtime == "deepspeed"
    c = res.scored.cols
    zo = np.flatnonzero(res.scored.feasible & _zero_offload(c))
    assert len(zo)
    row = zo[np.argmax(c["tokens_per_s"][zo])]
    plan = plans(res, np.array([row]))[0]
    assert plan.precision is Precision.FP16
    assert plan.predicted["memory_bytes"]["total"] <= res.request.profile.device.memory_bytes
    files = export_plan(get_target("deepspeed"), plan, plan.model_spec(),
                        ExportOptions(gpus_per_node=res.request.profile.gpus_per_node))
    config = json.loads(next(iter(files.values())))
    assert config["zero_optimization"]["stage"] == 2
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["fp16"]["enabled"] is True
