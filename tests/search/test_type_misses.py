"""A multi-type search (`--cluster A,B`) says why a GPU type has no feasible plan as a search of
that type alone says it: a V100 under Megatron with flash attention forced is refused by the
runtime's rule, in the rule's words, not a bare "no feasible plan" (review finding H1.5)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from autoplan.commands import main

FLASH_ONLY = {"schema_version": 1, "name": "flash-only", "parallel": {"tp": [1, 2], "pp": [1]},
              "zero_stage": [1], "micro_batch_size": [1, 2], "attention": ["flash"]}
JOB = ["search", "--model", "gpt3-1.3b", "--num-gpus", "8", "--global-batch-size", "64",
       "--runtime", "megatron", "--precision", "fp16"]


def test_a_type_every_candidate_of_which_its_runtime_refuses_says_the_rule(tmp_path: Path,
                                                                           capsys) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(FLASH_ONLY), encoding="utf-8")
    job = [*JOB, "--space", str(space)]
    assert main([*job, "--cluster", "v100-sxm2-32gb", "--format", "json"]) == 3
    alone = json.loads(capsys.readouterr().out)["nearest"]
    assert alone["reason"] == "runtime-unsupported"
    assert any("attention flash on V100-SXM2-32GB" in m for m in alone["misses"])

    both = [*job, "--cluster", "v100-sxm2-32gb,a100-sxm4-80gb"]
    assert main([*both, "--format", "json"]) == 0
    rows = {r["which"]: r for r in json.loads(capsys.readouterr().out)["by_cluster"]}
    assert not rows["v100-sxm2-32gb"]["feasible"]
    assert rows["v100-sxm2-32gb"]["nearest"] == {"reason": alone["reason"],
                                                 "misses": alone["misses"]}
    assert "nearest" not in rows["a100-sxm4-80gb"] and rows["a100-sxm4-80gb"]["feasible"]

    assert main([*both, "--format", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (f"  v100-sxm2-32gb: no feasible plan; nearest (runtime-unsupported): "
            f"{'; '.join(alone['misses'])}") in lines
