"""`autoplan profile` (profiler.cli): requests are checked before measuring, and the profile's
fields are applied in an order where each step reads final ones."""

from __future__ import annotations

import copy

import pytest
import torch

from autoplan.commands import main
from autoplan.profiler import build, cli
from autoplan.profiler.compute import Timing
from autoplan.profiler.dispatch import DispatchCosts
from autoplan.profiler.precision import PrecisionFigures
from autoplan.resources import PROFILES, find
from autoplan.yaml_io import read_yaml


def test_more_ranks_than_gpus_is_refused_before_measuring(monkeypatch, tmp_path, capsys) -> None:
    """On CUDA each rank takes a GPU: `--ranks 4` on two GPUs failed only at the collectives,
    the last measurement, when rank 2's set_device raised."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")

    def measure(*_):
        pytest.fail("measured before refusing --ranks")

    monkeypatch.setattr(cli, "_measure", measure)
    out = tmp_path / "p.yaml"
    assert main(["profile", "--device", "cuda", "--ranks", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--ranks: got 4" in err and "--ranks 1 to 2" in err and "2 GPU(s)" in err
    assert not out.exists()


def test_a_name_that_is_no_plain_file_name_is_refused_with_out_too(monkeypatch, tmp_path,
                                                                     capsys) -> None:
    """`--name "bad name/x" --out x.yaml` wrote a profile by a name --cluster cannot find."""
    monkeypatch.setattr(cli, "_measure", lambda *_: pytest.fail("measured before refusing"))
    out = tmp_path / "x.yaml"
    assert main(["profile", "--name", "bad name/x", "--out", str(out)]) == 2
    assert "--name: 'bad name/x' is not a plain file name" in capsys.readouterr().err
    assert not out.exists()


def _measured() -> cli._Measured:
    """Made-up measurements, each distinct from cpu-gloo's figures."""
    rows = [[1024.0, 3e-4], [65536.0, 4e-4], [4194304.0, 5e-3]]
    ops = {op: rows for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")}
    return cli._Measured(
        matmul=[Timing(1e6, 1e-4), Timing(1e9, 2e-2)], copy_bw=8e9, elem_bw=4e9,
        dispatch=DispatchCosts(7e-6, 3e-5, 2e-5, 4e-5, 40, 60, 4, 1e-4, 2e-6, 3e-6),
        host_bw=5e9, adam=2e8,
        sixteen_bit=PrecisionFigures({"fp32": 1.0, "bf16": 3.0},
                                     {"fp32": (1e-3, 3e-3), "bf16": (2e-3, 9e-3)}, 1e8),
        tables={"layers": {"columns": [], "rows": []}, "layer_models": {}},
        collectives={2: ops | {"send_recv": rows}})


def test_layer_points_are_judged_on_the_final_profile(monkeypatch, tmp_path) -> None:
    """feed_layer_points prices blocks with the per-op costs, the attention figures and the
    collectives, so it runs once all of them are in the profile (it ran inside assemble, with
    the base profile's)."""
    seen: list[dict] = []

    def feed(prof, layers, precision) -> None:
        seen.append(copy.deepcopy(prof))

    monkeypatch.setattr(build, "feed_layer_points", feed)
    base = read_yaml(find(PROFILES, "cpu-gloo"), "--base")
    req = cli._Request(device=torch.device("cpu"), precision="fp32", base=base, name="t",
                       out=tmp_path / "t.yaml", groups=[2], quick=True)
    prof = cli._profile(req, _measured())
    assert seen == [prof]
    eff = seen[0]["efficiency"]
    assert eff["dtensor_op_overhead_s"] == 3e-5 != base["efficiency"]["dtensor_op_overhead_s"]
    assert eff["attention_forward"] != base["efficiency"]["attention_forward"]
    assert seen[0]["collectives"]["all_reduce"][2]["y"] == [3e-4, 4e-4, 5e-3]
