"""Shared builders for the search tests: small spaces written to tmp files and requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.search.engine import SearchRequest
from autoplan.search.targets import Targets
from autoplan.search_space import load_space, space_from_dict

SMALL_SPACE: dict[str, Any] = {
    "schema_version": 1, "name": "test-small",
    "parallel": {"dp": None, "tp": [1, 2, 4], "pp": [1, 2, 4], "cp": [1]},
    "sequence_parallel": [False, True],
    "pipeline": {"schedule": ["1f1b", "interleaved-1f1b", "gpipe"], "vpp": [1, 2]},
    "zero_stage": [0, 1, 3], "offload": {"optimizer": [False], "params": [False]},
    "recompute": {"policy": ["none", "full"], "num_layers": [None, 1]},
    "micro_batch_size": [1, 2], "precision": "fp32", "attention": ["flash", "eager"],
}


def request(space: Any = None, *, model: str = "tiny", cluster: str = "cpu-gloo",
            gpus: tuple[int, ...] = (4,), gbs: int = 8, **kw: Any) -> SearchRequest:
    if space is None:
        space = space_from_dict(SMALL_SPACE)
    elif isinstance(space, dict):
        space = space_from_dict(space)
    elif isinstance(space, str):
        space = load_space(space)
    targets = kw.pop("targets", Targets())
    return SearchRequest(load_model(model), model, load_profile(cluster), cluster, space, gpus,
                         gbs, targets, **kw)


@pytest.fixture
def space_file(tmp_path: Path):
    def write(data: dict[str, Any], name: str = "space.yaml") -> Path:
        p = tmp_path / name
        p.write_text(yaml.safe_dump(data), encoding="utf-8")
        return p

    return write
