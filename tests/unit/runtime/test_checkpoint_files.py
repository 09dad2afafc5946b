"""Checkpoint folders are user data (#14 items 1, 14, 15): a crafted `.metadata` is refused
without running anything, damaged checkpoints are skipped for the newest intact one, old ones
are pruned, half-written ones cleaned, and a checkpoint of another model is refused by field."""

from __future__ import annotations

import dataclasses
import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.plan_files import save_plan
from autoplan.runtime.checkpoint_compat import check_resumable, checkpoint_meta
from autoplan.runtime.checkpoint_files import (
    CheckpointRefused,
    CorruptCheckpoint,
    SafePlanner,
    SafeReader,
    clean_temporaries,
    fallback_warning,
    newest_intact,
    prune,
    read_metadata_file,
    verify,
)
from autoplan.runtime.models.transformer import build_meta_model
from tests.dist.parity import TEST_MODELS, make_plan


class _Payload:
    """Unpickling this creates `target` (what an attacker's code would do)."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def _save(path: Path, spec, tp: int = 1, step: int = 5, plan=None) -> None:
    """A real single-process DCP checkpoint of the model as the runtime names it."""
    model = build_meta_model(spec, tp=tp).to_empty(device="cpu")
    state = {"model": {k: v for k, v in model.state_dict().items()
                       if not (spec.tie_embeddings and k == "output.weight")},
             "optim": {"param_groups.lr": 1e-3, "param_groups.betas": (0.9, 0.95)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(path))
    plan = plan or make_plan()
    meta = {"step": step, **checkpoint_meta(plan, spec, plan.world_size)}
    (path / "meta.json").write_text(json.dumps(meta))


def test_crafted_metadata_is_refused_and_runs_nothing(tmp_path):
    target = tmp_path / "pwned"
    crafted = pickle.dumps(_Payload(target))
    pickle.loads(crafted)  # the payload is live: plain pickle creates the file
    assert target.exists()
    target.unlink()
    ck = tmp_path / "ck"
    _save(ck / "step-00000005", TEST_MODELS["h8-2l"])
    (ck / "step-00000005" / ".metadata").write_bytes(crafted)
    with pytest.raises(CheckpointRefused, match="builtins.open|io.open"):
        read_metadata_file(ck / "step-00000005" / ".metadata")
    assert not target.exists()
    plan = save_plan(make_plan("h8-2l"), tmp_path / "plan.yaml")
    code = main(["train", str(plan), "--resume", "--checkpoint-dir", str(ck), "--steps", "6"])
    assert code == 2 and not target.exists()


def test_crafted_pickle_in_a_byte_item_is_refused(tmp_path):
    """DCP's default planner would torch.load(weights_only=False) non-tensor items."""
    ck = tmp_path / "ck"
    target = tmp_path / "pwned"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"x": _Payload(target), "w": torch.ones(2)}, checkpoint_id=str(ck))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"x": None, "w": torch.zeros(2)}, checkpoint_id=str(ck))  # DCP's defaults
    assert target.exists()  # ... run the payload
    target.unlink()
    state = {"x": None, "w": torch.zeros(2)}
    with pytest.raises(dcp.api.CheckpointException) as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(state, storage_reader=SafeReader(str(ck)), planner=SafePlanner())
    assert "Unsupported global: GLOBAL io.open" in repr(info.value.failures)
    assert not target.exists()


def test_safe_reader_loads_real_checkpoints_with_byte_items(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, TEST_MODELS["h8-2l"])
    state = {"model": {k: torch.full_like(v, 7.0) for k, v in
                       build_meta_model(TEST_MODELS["h8-2l"]).to_empty(device="cpu")
                       .state_dict().items()},
             "optim": {"param_groups.lr": 0.0, "param_groups.betas": (0.0, 0.0)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=SafeReader(str(ck)), planner=SafePlanner())
    assert state["optim"] == {"param_groups.lr": 1e-3, "param_groups.betas": (0.9, 0.95)}


def test_damaged_latest_checkpoint_falls_back_with_one_warning(tmp_path):
    spec = TEST_MODELS["h8-2l"]
    for step in (5, 10, 15):
        _save(tmp_path / f"step-{step:08d}", spec, step=step)
    data = next((tmp_path / "step-00000015").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])  # truncated by a full disk or a kill
    (tmp_path / "step-00000010" / ".metadata").write_bytes(b"\x80\x04garbage")
    found, skipped = newest_intact(tmp_path)
    assert found is not None and found.step == 5 and len(skipped) == 2
    line = fallback_warning(found, skipped)
    assert "\n" not in line and "step-00000005" in line and "skipped 2" in line
    with pytest.raises(CorruptCheckpoint):
        verify(tmp_path / "step-00000015")


def test_prune_keeps_the_newest_and_temporaries_are_cleaned(tmp_path):
    for step in range(1, 6):
        (tmp_path / f"step-{step:08d}").mkdir()
    (tmp_path / "step-00000006.tmp").mkdir()
    (tmp_path / "notes").mkdir()
    prune(tmp_path, keep=2)
    assert clean_temporaries(tmp_path) == [tmp_path / "step-00000006.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step-00000004",
                                                          "step-00000005"]


def test_a_different_model_is_refused_by_field_a_different_layout_resumes(tmp_path):
    spec = TEST_MODELS["h8-2l"]
    _save(tmp_path / "step-00000005", spec, plan=make_plan("h8-2l"))
    found = verify(tmp_path / "step-00000005")
    wider = dataclasses.replace(spec, hidden_size=128)
    with pytest.raises(ConfigError, match=r"model\.hidden_size 64 -> 128.*cannot"):
        check_resumable(found, make_plan(wider, tp=2), wider)
    note = check_resumable(found, make_plan("h8-2l", tp=4), spec)  # 256 rows -> 512 at tp 4
    assert note is not None and "tp 1 -> 4" in note and "reshards" in note
    # without meta.json's model (a hand-copied folder): the tensor shapes still decide
    (tmp_path / "step-00000005" / "meta.json").write_text(json.dumps({"step": 5}))
    with pytest.raises(ConfigError, match=r"pos.weight saved \[32, 64\], this model needs \[32, 128"):
        check_resumable(verify(tmp_path / "step-00000005"), make_plan(wider), wider)


def test_resume_with_another_model_exits_2_before_launch(tmp_path, capsys):
    spec = TEST_MODELS["h8-2l"]
    ck = tmp_path / "ck"
    _save(ck / "step-00000005", spec, plan=make_plan("h8-2l"))
    other = dataclasses.replace(spec, num_layers=3, name="h8-3l")
    plan = save_plan(make_plan(other), tmp_path / "plan.yaml")
    code = main(["train", str(plan), "--resume", "--checkpoint-dir", str(ck), "--steps", "6"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "model.num_layers 2 -> 3" in err and "Size mismatch" not in err
