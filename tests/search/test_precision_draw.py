"""A sampled trial draws precision among the formats its device runs (trial_space.pick_precision):
an A100 of a multi-type H100 + A100 search spent about half its trials on fp8 it cannot score.
Codes stay indexes into the space's formats, single-type studies keep the parameter `precision`,
and studies stored when every type drew every format resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autoplan.hardware import load_profile
from autoplan.plan import Precision
from autoplan.search import trial_space
from autoplan.search.engine import GpuType, SearchRequest, run_search, type_requests
from autoplan.search.trial_space import PRECISION_PARAM, device_precisions, pick_precision
from tests.search.conftest import SMALL_SPACE, request

H100, A100 = "h100-sxm-80gb", "a100-sxm4-80gb"
AUTO = {**SMALL_SPACE, "precision": "auto"}  # (bf16, fp8) for both types together
THREE = {**SMALL_SPACE, "precision": ["bf16", "fp16", "fp8"]}  # the A100 runs two of them


def _two_types(space: dict[str, Any], trials: int, db: str | None = None, **kw: Any
               ) -> SearchRequest:
    types = tuple(GpuType(ref, load_profile(ref), (8,)) for ref in (H100, A100))
    study = {"storage": db, "study": "m"} if db else {}
    return request(space, cluster=H100, gpus=(8,), gbs=16, sampler="tpe", trials=trials,
                   seed=3, types=types, **study, **kw)


def _trials(db: str, name: str) -> list[FrozenTrial]:
    study = optuna.load_study(study_name=name, storage=db)
    return sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                  key=lambda t: t.number)


def _codes(trials: list[FrozenTrial]) -> list[int]:
    """The precision code of every trial that reached a layout."""
    return [t.user_attrs["record"]["layout"]["precision"] for t in trials
            if t.user_attrs["record"]["layout"] is not None]


def _old_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial space before the change: every device drew every format of the space."""
    monkeypatch.setattr(trial_space, "device_precisions", lambda req: list(req.space.precision))


def test_the_a100s_trials_draw_no_fp8_and_the_h100s_do(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = _two_types(AUTO, trials=40, db=db)
    [h100, a100] = type_requests(req)
    assert h100.space.precision == a100.space.precision == (Precision.BF16, Precision.FP8)
    fp8 = a100.space.precision.index(Precision.FP8)
    result = run_search(req)
    on_a100, on_h100 = _trials(db, f"m/{A100}"), _trials(db, f"m/{H100}")
    assert len(on_a100) == len(on_h100) == 40
    assert _codes(on_a100) and fp8 not in _codes(on_a100)
    assert all(not k.startswith("precision") for t in on_a100 for k in t.params)  # not drawn
    assert fp8 in _codes(on_h100)
    assert result.scored.counts["precision-unsupported"] == 0
    c = result.scored.cols
    assert fp8 in c["precision"][c["cluster"] == 0]  # the H100's fp8 rows ranked beside bf16's


def test_without_it_the_a100_spent_trials_on_fp8(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same search under the old draw: the test above can fail."""
    _old_draw(monkeypatch)
    db = f"sqlite:///{tmp_path / 's.db'}"
    result = run_search(_two_types(AUTO, trials=40, db=db))
    fp8 = result.request.space.precision.index(Precision.FP8)
    assert fp8 in _codes(_trials(db, f"m/{A100}"))


def test_a_single_type_study_still_draws_precision() -> None:
    """An H100's own `precision: auto` (bf16, fp8) is drawn under its old name, so its studies
    resume unchanged; the A100's own (bf16) is not drawn at all, as before."""
    names: dict[str, set[str]] = {}
    for ref in (H100, A100):
        req = request(AUTO, cluster=ref, gpus=(8,), gbs=16, sampler="random", trials=12)
        study = optuna.create_study()
        for _ in range(12):
            trial_space.suggest_layout(study.ask(), req)
        names[ref] = {k for t in study.trials for k in t.params if k.startswith("precision")}
    assert names == {H100: {"precision"}, A100: set()}


def test_a_device_running_some_formats_draws_them_under_another_name() -> None:
    """An A100 of a space listing bf16, fp16 and fp8 draws between bf16 and fp16 as
    `precision@device`; the code it returns still indexes the space's three formats."""
    [h100, a100] = type_requests(_two_types(THREE, trials=1))
    assert device_precisions(h100) == list(h100.space.precision)
    assert device_precisions(a100) == [Precision.BF16, Precision.FP16]
    fixed = optuna.trial.FixedTrial({PRECISION_PARAM: "fp16", "precision": "fp8"})
    assert pick_precision(fixed, a100) == 1  # fp16's index among (bf16, fp16, fp8)
    assert pick_precision(fixed, h100) == 2  # the H100 reads `precision`: fp8


def test_a_device_running_none_of_the_formats_draws_all_of_them() -> None:
    """Nothing to narrow to: the trials are counted precision-unsupported, as the exhaustive
    search counts the rows, and the infeasible line names the format."""
    req = request({**SMALL_SPACE, "precision": ["fp8"]}, cluster=A100, gpus=(8,), gbs=16,
                  sampler="tpe", trials=10)
    assert device_precisions(req) == [Precision.FP8]
    result = run_search(req)
    assert result.scored.n == 0 and result.scored.counts["precision-unsupported"] > 0
    assert result.miss is not None and "precision=fp8 is not supported" in " ".join(
        result.miss.misses)


@pytest.mark.parametrize("space", [AUTO, THREE], ids=["auto", "three-formats"])
def test_a_study_stored_before_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       space: dict[str, Any]) -> None:
    """Studies stored when the A100 drew every format (Optuna param `precision` among them)
    resume: the old trials keep their records, and the new ones draw only what the A100 runs;
    among two formats under `precision@device` (under `precision` Optuna refuses the changed
    choices, and every such trial was lost as unreachable)."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    with monkeypatch.context() as old:
        _old_draw(old)
        first = run_search(_two_types(space, trials=30, db=db))
    before = _trials(db, f"m/{A100}")
    formats = first.request.space.precision
    fp8 = formats.index(Precision.FP8)
    assert fp8 in _codes(before)  # the stored study does hold the A100's fp8 trials
    again = run_search(_two_types(space, trials=30, db=db))  # resumes: nothing sampled
    assert list(again.scored.cols["trial"]) == list(first.scored.cols["trial"])
    assert list(again.scored.cols["tokens_per_s"]) == list(first.scored.cols["tokens_per_s"])
    more = run_search(_two_types(space, trials=60, db=db))
    after = _trials(db, f"m/{A100}")
    assert len(after) == 60 and [t.params for t in after[:30]] == [t.params for t in before]
    new = _codes(after[30:])
    assert new and fp8 not in new
    runs = {formats.index(p) for p in (Precision.BF16, Precision.FP16) if p in formats}
    assert set(new) == runs  # every format the A100 runs is still drawn
    assert more.total == 120 and more.best is not None
