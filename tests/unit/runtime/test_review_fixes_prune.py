"""Review fix in runtime/checkpoint.py: a damaged checkpoint the resume skipped does not count
toward --keep-checkpoints (it took an intact one's place) and is left in place, not deleted."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist

from autoplan.runtime.checkpoint import Checkpointer
from autoplan.runtime.models.transformer import build_meta_model
from tests.dist.parity import TEST_MODELS, make_plan

SPEC = TEST_MODELS["h8-2l"]


@pytest.fixture
def one_process():
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if owned:
        dist.destroy_process_group()


def _names(root):
    return sorted(p.name for p in root.iterdir())


def test_a_damaged_checkpoint_does_not_take_an_intact_ones_place(tmp_path, one_process,
                                                                  caplog):
    """The reviewer's case: step-6 truncated, the resume from step-4 saved step 5 and pruned
    the intact step-2, keeping the damaged step-6 among the three."""
    torch.manual_seed(0)
    model = build_meta_model(SPEC).to_empty(device="cpu")
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(tmp_path, [model], [opt], keep=3)
    for step in (2, 4, 6):
        ckpt.save(step)
    data = next((tmp_path / "step-00000006").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])  # truncated
    resumed = Checkpointer(tmp_path, [model], [opt], keep=3)
    assert resumed.load_newest(make_plan("h8-2l"), SPEC) == 4
    with caplog.at_level(logging.WARNING, logger="autoplan.runtime.checkpoint"):
        resumed.save(5)
        resumed.save(7)
    # intact: 7, 5, 4 kept, 2 pruned; the damaged 6 neither counted nor deleted
    assert _names(tmp_path) == ["step-00000004", "step-00000005", "step-00000006",
                                "step-00000007"]
    assert (tmp_path / "step-00000006" / data.name).stat().st_size == 100
    warned = [r.getMessage() for r in caplog.records if "left damaged" in r.getMessage()]
    assert len(warned) == 1 and "step-00000006" in warned[0], warned  # once, not every save


def test_prune_intact_counts_only_intact_checkpoints(tmp_path, one_process):
    from autoplan.runtime.checkpoint import prune_intact

    model = build_meta_model(SPEC).to_empty(device="cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(tmp_path, [model], [opt], keep=0)  # keep all while building
    for step in (1, 2, 3, 4):
        ckpt.save(step)
    (tmp_path / "step-00000004" / ".metadata").write_bytes(b"\x80\x04garbage")
    assert prune_intact(tmp_path, 0) == ([], [])
    deleted, damaged = prune_intact(tmp_path, 2)
    assert deleted == [tmp_path / "step-00000001"]
    assert damaged == [tmp_path / "step-00000004"]
    assert _names(tmp_path) == ["step-00000002", "step-00000003", "step-00000004"]
