"""A stand-in for a saved checkpoint, for the resume checks that read only its metadata
(runtime.checkpoint_compat.check_resumable): meta.json's model fields and the tensor shapes
torch.distributed.checkpoint's metadata lists, both of the model it was saved with."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from autoplan.model_spec import ModelSpec
from autoplan.runtime.checkpoint_compat import expected_shapes, model_fields


def saved_as(model: ModelSpec, folder: Path, step: int = 3) -> SimpleNamespace:
    """A checkpoint of `model` (one rank) at `step` in `folder`, as check_resumable finds one."""
    metadata = SimpleNamespace(state_dict_metadata={
        f"model.{k}": SimpleNamespace(size=v) for k, v in expected_shapes(model, 1).items()})
    return SimpleNamespace(meta={"model": model_fields(model)}, metadata=metadata,
                           path=folder / f"step-{step:08d}", step=step)
