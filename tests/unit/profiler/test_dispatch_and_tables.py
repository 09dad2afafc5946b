"""Per-op host costs (profiler.dispatch) and the measured collective tables."""

from __future__ import annotations

import pytest
import torch

from autoplan.cost.compute import block_ops
from autoplan.hardware import CollectiveTimes
from autoplan.model_spec import PRESETS
from autoplan.profiler import collectives, dispatch
from autoplan.yaml_io import from_dict


def test_tables_are_monotone_and_all_gather_is_priced_by_its_output() -> None:
    measured = {2: {"all_gather": [[1024.0, 4e-3], [4096.0, 3e-4], [16384.0, 5e-4]],
                    "all_reduce": [[1024.0, 2e-4], [4096.0, 3e-4], [16384.0, 2.5e-4]]}}
    tables = collectives.collective_tables(measured)
    ag, ar = tables["all_gather"][2], tables["all_reduce"][2]
    assert ag["x"] == [2048.0, 8192.0, 32768.0]
    assert ag["y"] == [3e-4, 3e-4, 5e-4]  # the 4 ms outlier at 1 KiB is dropped
    assert ar["y"] == [2e-4, 2.5e-4, 2.5e-4]
    loaded = from_dict(CollectiveTimes, tables, "collectives")  # what the profile loader does
    assert loaded.table("all_gather")[2](2048.0) == pytest.approx(3e-4)


def test_dispatch_costs_are_measured_per_op_of_the_runtime_block() -> None:
    torch.set_num_threads(1)
    costs = dispatch.measure_dispatch(torch.device("cpu"), quick=True)
    assert (costs.forward_ops, costs.gemm_ops) == block_ops(PRESETS["tiny"])[::2]
    assert costs.op_overhead_s > 0
    # DTensor and the checkpoint machinery add host work per op on a CPU
    assert costs.dtensor_op_overhead_s > 0 and costs.selective_op_overhead_s > 0
    prof: dict = {"efficiency": {}}
    dispatch.apply_dispatch(prof, costs, torch.device("cpu"))
    assert prof["efficiency"]["dtensor_op_overhead_s"] == costs.dtensor_op_overhead_s
    assert prof["measured"]["dispatch"]["block_ops"][0] == costs.forward_ops
    # a GPU profile keeps the figures under `measured` and charges none of them
    gpu: dict = {"efficiency": {}}
    dispatch.apply_dispatch(gpu, costs, torch.device("cuda", 0))
    assert all(v == 0.0 for v in gpu["efficiency"].values())
    assert gpu["measured"]["dispatch"]["op_overhead_s"] == costs.op_overhead_s
