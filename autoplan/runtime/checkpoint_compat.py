"""Can a checkpoint continue under this plan? What changed, and what DCP can and cannot reshard.

A different parallel layout (dp, tp, pp, cp, ep, etp, vpp, ZeRO, offload, recompute, precision)
resumes: DCP reshards every tensor by its layout-independent FQN, and the vocabulary's padding rows
(a multiple of 128*tp, cost/params.py) are re-padded on load. A different model shape cannot:
the saved tensors do not fit. Neither can another optimizer (its state has other keys), nor
another global batch, data or seed: step t reads samples [(t-1)B, t*B) of the (data, seed)
stream (data.py), so the resumed run would skip or repeat samples; the data is compared by its
path and by its fingerprint (files, sizes, SHA-256), so an edited corpus is refused too. --lr
and the weight decay may change: the run's values replace the checkpoint's. All of it is
decided here from meta.json and the DCP metadata, before any rank loads anything.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import ConfigError
from autoplan.model_spec import OMITTED_AT_DEFAULT, ModelSpec, model_dict
from autoplan.moe_spec import moe_dict
from autoplan.plan import Plan
from autoplan.rope_scaling import RopeScaling, same_rotation
from autoplan.yaml_io import from_dict, show, to_dict

VOCAB_FQNS = ("embed.tok.weight", "output.weight")
"""Tensors whose first dimension is the (padded) vocabulary."""
_CAN = ("a different parallel layout (dp/tp/pp/cp/ep, ZeRO, offload, recompute, precision) "
        "resumes, DCP reshards it; a different model shape cannot: train it with a new "
        "--checkpoint-dir")


def model_fields(spec: ModelSpec) -> dict[str, Any]:
    out = model_dict(to_dict(spec))  # rope_theta at its default: as saved before it
    if out.get("moe") is not None:  # routing fields at their defaults: as saved before them
        out["moe"] = moe_dict(out["moe"])
    return out


def layout_fields(plan: Plan) -> dict[str, Any]:
    """Every degree of the layout (the expert ones and HSDP's shard group too) with the ZeRO
    stage and precision: what layout_changes names when a resume reshards."""
    p = plan.parallel
    return {"dp": p.dp, "dp_shard": p.dp_shard, "tp": p.tp, "pp": p.pp, "cp": p.cp,
            "ep": p.ep, "etp": p.etp, "vpp": plan.pipeline.vpp,
            "zero_stage": plan.zero_stage, "precision": plan.precision.value}


@dataclass(frozen=True)
class RunSettings:
    """What meta.json records of the run beside the model and layout (its `run` section)."""

    optimizer: str
    lr: float
    weight_decay: float
    global_batch_size: int
    data: str | None
    """--data, resolved; None for synthetic tokens."""
    seed: int
    data_fingerprint: dict[str, Any] | None = None
    """The corpus as read (data.scan_corpus): `files` ([name, bytes] in reading order),
    `bytes` and `sha256`; None for synthetic tokens, or where the caller did not read it."""

    @classmethod
    def of(cls, args: argparse.Namespace, plan: Plan, weight_decay: float = 0.0,
           data_fingerprint: dict[str, Any] | None = None) -> RunSettings:
        data = str(Path(args.data).expanduser().resolve()) if args.data is not None else None
        return cls(optimizer=args.optimizer, lr=float(args.lr), weight_decay=weight_decay,
                   global_batch_size=plan.batch.global_batch_size, data=data,
                   seed=int(args.seed), data_fingerprint=data_fingerprint)


def checkpoint_meta(plan: Plan, spec: ModelSpec, world_size: int,
                    run: RunSettings | None = None) -> dict[str, Any]:
    """What meta.json records beside the step (and `consumed_samples`, Checkpointer.save's
    caller adds it): the model and the layout it was saved under, and the run's settings."""
    out = {"world_size": world_size, "model": model_fields(spec), "layout": layout_fields(plan)}
    if run is not None:
        out["run"] = asdict(run)
    return out


def model_changes(meta: dict, spec: ModelSpec) -> list[str]:
    """`model.FIELD saved -> now` for every model field that differs (the name aside; a
    rope_scaling that rotates alike however spelt does not: _same_rotation)."""
    saved = meta.get("model")
    if not isinstance(saved, dict):
        return []
    # the RoPE base and scaling are left out at their defaults, as every checkpoint before them
    saved = {**OMITTED_AT_DEFAULT, **saved}
    now = {**OMITTED_AT_DEFAULT, **model_fields(spec)}
    return [f"model.{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if k != "name" and saved.get(k) != now.get(k) and not (
                k == "rope_scaling" and _same_rotation(saved.get(k), now.get(k)))]


def layout_changes(meta: dict, plan: Plan) -> list[str]:
    """`FIELD saved -> now` for every layout field that differs. A field the checkpoint does
    not record (ep, etp and dp_shard before they were saved) is not guessed at."""
    saved = meta.get("layout")
    if not isinstance(saved, dict):
        return []
    now = layout_fields(plan)
    return [f"{k} {saved[k]!r} -> {v!r}" for k, v in now.items() if k in saved and saved[k] != v]


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
    if changed and not shapes and changed == [_dropout_change(found.meta, spec)]:
        _refuse_dropout(found, spec)
    if changed and not shapes and all(c.startswith(ROPE_CHANGES) for c in changed):
        _refuse_rotation(found, spec)
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


def _dropout_change(meta: dict, spec: ModelSpec) -> str | None:
    """model_changes' line for a saved numeric dropout other than this run's, else None."""
    saved = meta["model"].get("dropout")
    if isinstance(saved, (int, float)) and not isinstance(saved, bool) and saved != spec.dropout:
        return f"model.dropout {saved!r} -> {model_fields(spec).get('dropout')!r}"
    return None


def _refuse_dropout(found, spec: ModelSpec) -> None:
    """Only the dropout differs: the flag that sets it (--dropout replaces the plan's
    model.dropout, launch.run_dropout) continues the run at the saved rate."""
    saved = found.meta["model"].get("dropout")
    raise ConfigError("--dropout", f"{spec.dropout!r}, but {found.path.name} was saved with "
                      f"dropout {saved!r}", f"pass --dropout {saved!r} to continue it, "
                      f"{_NEW_RUN}")


def saved_optimizer(found) -> str | None:
    """The optimizer `found` was saved with: meta.json's, else told by its state's keys (AdamW
    keeps exp_avg_sq, SGD's param groups have momentum); None when neither says."""
    run = found.meta.get("run")
    if isinstance(run, dict) and isinstance(run.get("optimizer"), str):
        return str(run["optimizer"])
    keys = found.metadata.state_dict_metadata
    if any(k.startswith("optim.state.") and k.endswith(".exp_avg_sq") for k in keys):
        return "adamw"
    if any(k.startswith("optim.param_groups.") and k.endswith(".momentum") for k in keys):
        return "sgd"
    return None


_NEW_RUN = "or start a new run in an empty --checkpoint-dir"
ROPE_CHANGES = ("model.rope_theta ", "model.rope_scaling ")
"""model_changes lines of the rotation alone: the weights fit, the positions mean otherwise."""


def _rotation(theta: float, scaling: Any) -> str:
    read = _read_scaling(scaling)
    if read is None:
        return f"RoPE base {theta:g} without scaling"
    if isinstance(read, RopeScaling):
        return f"RoPE base {theta:g} with {read.describe()}"
    return f"RoPE base {theta:g} with scaling {show(scaling, 120)}"


def _read_scaling(saved: Any) -> Any:
    """A rope_scaling as meta.json saved it (a mapping, or None: none) read as a RopeScaling;
    the value itself where it does not read as one."""
    if not saved:
        return None
    try:
        return from_dict(RopeScaling, saved, "model.rope_scaling")
    except ConfigError:
        return saved


def _same_rotation(saved: Any, now: Any) -> bool:
    """Two saved rope_scaling values that rotate alike (rope_scaling.same_rotation: by effect,
    however the mscales are spelt); compared as written where either does not read."""
    a, b = _read_scaling(saved), _read_scaling(now)
    if all(x is None or isinstance(x, RopeScaling) for x in (a, b)):
        return same_rotation(a, b)
    return bool(saved == now)


def _refuse_rotation(found, spec: ModelSpec) -> None:
    """A checkpoint whose weights fit but whose model rotated positions otherwise: the presets
    of Llama 3, Mixtral, Qwen3 and gpt-oss took their published bases, Llama 3.1's its
    scaling, and DeepSeek-V3's and gpt-oss's their YaRN, after checkpoints of them had been
    saved."""
    saved = {**OMITTED_AT_DEFAULT, **found.meta["model"]}
    now = {**OMITTED_AT_DEFAULT, **model_fields(spec)}
    fix = [f"rope_theta: {saved['rope_theta']:g}"] if saved["rope_theta"] != now["rope_theta"] else []
    if not _same_rotation(saved["rope_scaling"], now["rope_scaling"]):
        fix.append("the saved rope_scaling" if saved["rope_scaling"] else "no rope_scaling")
    raise ConfigError("--resume", f"{found.path} was trained at "
                      f"{_rotation(saved['rope_theta'], saved['rope_scaling'])}, this model "
                      f"rotates at {_rotation(now['rope_theta'], now['rope_scaling'])} (the "
                      "presets took their published bases and scaling after it was saved)",
                      f"resume with a model file that sets {' and '.join(fix)}, {_NEW_RUN}")


def check_settings(found, run: RunSettings) -> str | None:
    """Raise ConfigError when the run's optimizer, global batch, data or seed differs from
    those `found` was saved with; else return a line naming a changed lr or weight decay
    (the run's replace the checkpoint's), or None."""
    name = found.path.name
    saved_opt = saved_optimizer(found)
    if saved_opt is not None and saved_opt != run.optimizer:
        raise ConfigError("--optimizer", f"{run.optimizer}, but {name} was saved with "
                          f"{saved_opt}", f"pass --optimizer {saved_opt} to continue it, "
                          f"{_NEW_RUN}")
    saved = found.meta.get("run")
    if not isinstance(saved, dict):
        return None  # saved before meta.json recorded the run
    gbs = saved.get("global_batch_size")
    if gbs is not None and gbs != run.global_batch_size:
        consumed = found.meta.get("consumed_samples", found.step * gbs)
        raise ConfigError("--resume", f"{name} was saved with global_batch_size {gbs} "
                          f"({consumed} samples consumed), this plan has "
                          f"{run.global_batch_size}", f"resume with a plan of global_batch_size "
                          f"{gbs} (the samples of step t follow from t and the batch), {_NEW_RUN}")
    if "data" in saved and saved["data"] != run.data:
        what = "synthetic tokens" if saved["data"] is None else repr(saved["data"])
        give = "leave out --data" if saved["data"] is None else f"pass --data {saved['data']}"
        now = "synthetic tokens" if run.data is None else repr(run.data)
        raise ConfigError("--data", f"{now}, but {name} was saved training on {what}",
                          f"{give} to continue it, {_NEW_RUN}")
    _check_corpus(saved.get("data_fingerprint"), run, name)
    if "seed" in saved and saved["seed"] != run.seed:
        raise ConfigError("--seed", f"{run.seed}, but {name} was saved with --seed "
                          f"{saved['seed']}", f"pass --seed {saved['seed']} to continue it (the "
                          f"data order follows the seed), {_NEW_RUN}")
    changed = [f"{k} {saved[k]!r} -> {getattr(run, k)!r}" for k in ("lr", "weight_decay")
               if k in saved and saved[k] != getattr(run, k)]
    if changed:
        return f"resuming with {', '.join(changed)} (the command line replaces the checkpoint's)"
    return None


def _check_corpus(saved: Any, run: RunSettings, name: str) -> None:
    """The same --data path may hold other bytes now (a file edited, added or removed):
    refuse when the saved fingerprint differs (none saved, or none read: nothing to compare)."""
    now = run.data_fingerprint
    if not isinstance(saved, dict) or now is None or (
            saved.get("sha256") == now.get("sha256") and saved.get("files") == now.get("files")):
        return
    raise ConfigError("--data", f"{run.data} changed since {name} was saved "
                      f"({corpus_change(saved, now)})", "restore the files it was trained on to "
                      f"continue it, {_NEW_RUN}")


def corpus_change(saved: dict, now: dict) -> str:
    """The first difference between two data fingerprints, in words."""
    was = {str(n): s for n, s in saved.get("files") or []}
    has = {str(n): s for n, s in now.get("files") or []}
    for n in sorted(set(was) | set(has)):
        if n not in has:
            return f"{n} removed"
        if n not in was:
            return f"{n} added"
        if was[n] != has[n]:
            return f"{n} was {was[n]} bytes, now {has[n]}"
    return (f"same {len(has)} file(s) and sizes, other content: SHA-256 "
            f"{str(saved.get('sha256'))[:12]}... then, {str(now.get('sha256'))[:12]}... now")


def trained_already(step: int, steps: int, folder: str) -> str | None:
    """With --resume, a checkpoint at --steps is a finished run (a job resubmitted, requeued or
    chained after it ended): the line that says so, where the command trains nothing and
    exits 0; None for any other step (check_steps refuses one past --steps)."""
    if step != steps:
        return None
    trained = "the 1 step" if steps == 1 else f"all {steps} steps"
    return f"trained {trained} already (checkpoint step {step} in {folder}): nothing to do"


def check_steps(step: int, steps: int) -> None:
    """A resume must have a step left to train (trained_already says one at --steps under
    --resume first, which ends the run with nothing to do)."""
    if step >= steps:
        raise ConfigError("--steps", f"checkpoint step {step} >= --steps {steps}: nothing to "
                          "train", f"raise --steps above {step}")
