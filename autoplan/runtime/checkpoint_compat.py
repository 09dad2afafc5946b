"""Can a checkpoint continue under this plan? What changed, and what DCP can and cannot reshard.

A different parallel layout (dp, tp, pp, cp, vpp, ZeRO, offload, recompute, precision) resumes:
DCP reshards every tensor by its layout-independent FQN, and the vocabulary's padding rows
(a multiple of 128*tp, cost/params.py) are re-padded on load. A different model shape cannot:
the saved tensors do not fit. Both are decided here from meta.json and the DCP metadata,
before any rank loads anything.
"""

from __future__ import annotations

from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_spec import ModelSpec
from autoplan.moe_spec import moe_dict
from autoplan.plan import Plan
from autoplan.yaml_io import to_dict

VOCAB_FQNS = ("embed.tok.weight", "output.weight")
"""Tensors whose first dimension is the (padded) vocabulary."""
_CAN = ("a different parallel layout (dp/tp/pp/cp, ZeRO, offload, recompute, precision) "
        "resumes, DCP reshards it; a different model shape cannot: train it with a new "
        "--checkpoint-dir")


def model_fields(spec: ModelSpec) -> dict[str, Any]:
    out = to_dict(spec)
    if out.get("moe") is not None:  # routing fields at their defaults: as saved before them
        out["moe"] = moe_dict(out["moe"])
    return out


def layout_fields(plan: Plan) -> dict[str, Any]:
    p = plan.parallel
    return {"dp": p.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp, "vpp": plan.pipeline.vpp,
            "zero_stage": plan.zero_stage, "precision": plan.precision.value}


def checkpoint_meta(plan: Plan, spec: ModelSpec, world_size: int) -> dict[str, Any]:
    """What meta.json records beside the step: the model and the layout it was saved under."""
    return {"world_size": world_size, "model": model_fields(spec), "layout": layout_fields(plan)}


def model_changes(meta: dict, spec: ModelSpec) -> list[str]:
    """`model.FIELD saved -> now` for every model field that differs (the name aside)."""
    saved = meta.get("model")
    if not isinstance(saved, dict):
        return []
    now = model_fields(spec)
    return [f"model.{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if k != "name" and saved.get(k) != now.get(k)]


def layout_changes(meta: dict, plan: Plan) -> list[str]:
    saved = meta.get("layout")
    if not isinstance(saved, dict):
        return []
    now = layout_fields(plan)
    return [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in now.items() if saved.get(k) != v]


def expected_shapes(spec: ModelSpec, tp: int) -> dict[str, tuple[int, ...]]:
    """Global shapes of the model's tensors as checkpoints name them (tied head saved once)."""
    from autoplan.runtime.models.transformer import build_meta_model

    model = build_meta_model(spec, tp=tp)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if spec.tie_embeddings:
        shapes.pop("output.weight", None)
    return shapes


def shape_problems(metadata, spec: ModelSpec, tp: int) -> list[str]:
    """Saved model tensors that do not fit this model (missing, extra or misshapen)."""
    saved = {k[len("model."):]: tuple(getattr(v, "size", ()))
             for k, v in metadata.state_dict_metadata.items() if k.startswith("model.")}
    want = expected_shapes(spec, tp)
    out = [f"{k} is missing from the checkpoint" for k in sorted(set(want) - set(saved))]
    out += [f"the checkpoint has {k}, this model does not" for k in sorted(set(saved) - set(want))]
    for k in sorted(set(want) & set(saved)):
        a, b = saved[k], want[k]
        if k in VOCAB_FQNS and len(a) == len(b) == 2 and a[1] == b[1] and a[0] >= spec.vocab_size:
            continue  # the same vocabulary, padded for another tp
        if a != b:
            out.append(f"{k} saved {list(a)}, this model needs {list(b)}")
    return out


def check_resumable(found, plan: Plan, spec: ModelSpec) -> str | None:
    """Raise ConfigError when `found` (an Intact checkpoint) cannot continue under `plan`;
    else return a line saying what changed in the layout (None when nothing did)."""
    changed = model_changes(found.meta, spec)
    shapes = shape_problems(found.metadata, spec, plan.parallel.tp)
    if changed or shapes:
        what = ", ".join(changed) if changed else shapes[0]
        extra = f" ({shapes[0]})" if changed and shapes else ""
        raise ConfigError("--resume", f"{found.path} was saved for a different model: "
                          f"{what}{extra}", _CAN)
    layout = layout_changes(found.meta, plan)
    if layout:
        return (f"resuming step {found.step} saved under another layout ({', '.join(layout)}): "
                "DCP reshards it")
    return None
