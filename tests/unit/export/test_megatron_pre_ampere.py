"""Megatron on a GPU older than Ampere (review of 1917bc8): Transformer Engine's fused attention
needs sm80, so `export --to megatron` refuses a V100 plan with attention flash as the runtime
rule and the search do, and `import` reads Megatron's default `--attention-backend auto` on a
V100 as the unfused attention TE runs there."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.errors import ConfigError
from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.importers import import_megatron
from autoplan.export.registry import get_target
from autoplan.plan import Attention, plan_from_dict

OPTS = ExportOptions(gpus_per_node=8)
V100 = {"model": "gpt3-1.3b", "cluster": {"profile": "v100-sxm2-32gb", "num_gpus": 8},
        "parallel": {"dp": 8}, "zero_stage": 1, "precision": "fp16",
        "batch": {"micro_batch_size": 1, "global_batch_size": 8}}


def _export(plan_fields: dict) -> str:
    plan = plan_from_dict(plan_fields)
    files = export_plan(get_target("megatron"), plan, plan.model_spec(), OPTS)
    return next(iter(files.values()))


def test_a_v100_flash_plan_is_refused_and_its_eager_twin_exports_unfused() -> None:
    with pytest.raises(ConfigError, match="attention flash on V100-SXM2-32GB, older than "
                                          "Ampere.*set attention eager"):
        _export(V100 | {"attention": "flash"})
    assert "--attention-backend unfused" in _export(V100 | {"attention": "eager"})
    a100 = V100 | {"cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 8},
                   "precision": "bf16", "attention": "flash"}
    assert "--attention-backend fused" in _export(a100)


@pytest.mark.parametrize(("cluster", "backend", "kind"), [
    ("v100-sxm2-32gb", "auto", Attention.EAGER),  # TE's pick before Ampere: unfused
    ("a100-sxm4-80gb", "auto", Attention.FLASH),
    ("v100-sxm2-32gb", "unfused", Attention.EAGER),
    ("v100-sxm2-32gb", "fused", Attention.FLASH),  # as written: estimate then refuses it
])
def test_import_reads_the_default_backend_as_te_picks_it_on_the_gpu(
        tmp_path: Path, cluster: str, backend: str, kind: Attention) -> None:
    script = _export(V100 | {"attention": "eager"}).replace(
        "--attention-backend unfused", f"--attention-backend {backend}")
    path = tmp_path / "launch.sh"
    path.write_text(script)
    plan = import_megatron(path, model="gpt3-1.3b", cluster=cluster, num_gpus=None)
    assert plan.attention == kind
