"""A stored study resumed under another profile says which, in words (user test 36, findings 2
and 10): the study keeps the profile's name and fields beside the fingerprint's hash, the fix
names only a change that alone resumes it, and a price-only change, on which no stored record
depends, resumes."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import optuna
import pytest

from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.search.fingerprint import PROFILE_ATTR, fingerprint, mismatch
from autoplan.search.optuna_search import (
    FINGERPRINT_ATTRS,
    KIND_ATTR,
    open_study,
    run_optuna,
)
from autoplan.search.targets import Targets
from tests.search.conftest import SMALL_SPACE, request

AUTO = {**SMALL_SPACE, "precision": "auto", "attention": ["flash"]}


def _req(db: str, cluster: str = "a100-sxm4-80gb", space: dict | None = None, **kw):
    return request(AUTO if space is None else space, cluster=cluster, gpus=(8,),
                   sampler="random", trials=3, storage=db, study="s1", **kw)


def _refusal(req) -> str:
    with pytest.raises(ConfigError) as err:
        open_study(req, "random")
    text = str(err.value)
    assert "\n" not in text and len(text) < 400
    return text


def test_another_cluster_is_named_and_the_fix_given_resumes(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    open_study(_req(db), "random")
    text = _refusal(_req(db, "h100-sxm-80gb"))
    assert "--cluster a100-sxm4-80gb -> h100-sxm-80gb" in text
    assert 'space.precision ["bf16"] -> ["bf16", "fp8"]' in text
    assert "profile contents" not in text  # no bare hashes
    # the precision hint alone would still be refused (the profile changed too): not given
    assert "lists the study's precision" not in text
    assert text.endswith("to resume, give --cluster a100-sxm4-80gb (the study's profile), or "
                         "use another --study name")
    bf16 = dataclasses.replace(_req(db, "h100-sxm-80gb"), space=dataclasses.replace(
        _req(db).space_given, precision=_req(db).space.precision))
    assert "lists the study's precision" not in _refusal(bf16)
    open_study(_req(db), "random")  # the fix it gave resumes


def test_the_same_profile_edited_names_its_changed_fields(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    open_study(_req(db), "random")
    req = _req(db)
    four = dataclasses.replace(req, profile=dataclasses.replace(req.profile, gpus_per_node=4,
                                                                  price_per_gpu_hour=9.5))
    text = _refusal(four)
    assert ("profile a100-sxm4-80gb's contents changed: gpus_per_node 8 -> 4, "
            f"price_per_gpu_hour {req.profile.price_per_gpu_hour} -> 9.5") in text
    # the study's reference gives this same (edited) profile: no --cluster to suggest, and
    # rerunning the command is what was refused
    assert text.endswith("the profile changed since the study was made: restore it to resume, or use another --study name")
    eff = dataclasses.replace(req, profile=dataclasses.replace(
        req.profile, efficiency=dataclasses.replace(req.profile.efficiency,
                                                    attention_clock=0.5)))
    assert "contents changed: efficiency)" in _refusal(eff)  # a section is named, not shown


@pytest.mark.parametrize("objective", ["throughput", "latency", "cost"])
def test_a_price_only_change_resumes(tmp_path, objective) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = _req(db, targets=Targets(objectives=(objective,)))
    open_study(req, "random")
    cheaper = dataclasses.replace(req, profile=dataclasses.replace(
        req.profile, price_per_gpu_hour=0.5, description="re-priced"))
    open_study(cheaper, "random")  # resumes
    open_study(cheaper, "random")  # and again: the study still holds the creator's record
    unpriced = dataclasses.replace(req, profile=dataclasses.replace(
        req.profile, price_per_gpu_hour=None))
    open_study(unpriced, "random")


def test_no_stored_record_depends_on_the_price() -> None:
    """Why a price-only change may resume: a trial stores GPU-hours (the cost objective's
    value there), never dollars; the price multiplies them when the study is read."""
    req = request(AUTO, cluster="a100-sxm4-80gb", gpus=(8,), sampler="random", trials=6,
                  targets=Targets(objectives=("cost",)))
    scored = []
    for price in (0.5, 40.0):
        priced = dataclasses.replace(req, profile=dataclasses.replace(
            req.profile, price_per_gpu_hour=price))
        scored.append(run_optuna(priced, "random")[0].cols)
    assert scored[0].keys() == scored[1].keys()
    for k in scored[0]:
        assert np.array_equal(scored[0][k], scored[1][k]), k
    assert scored[0]["objectives"].size  # trials were scored


def _older_study(db: str, req) -> None:
    """A study as an autoplan before the profile record marked it."""
    study = optuna.create_study(storage=db, study_name="s1", directions=["maximize"])
    study.set_user_attr(FINGERPRINT_ATTRS["search"], fingerprint(req, "random"))
    study.set_user_attr(KIND_ATTR, "search")


def test_a_study_stored_before_the_record_says_another_profile(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    _older_study(db, _req(db))
    text = _refusal(_req(db, "h100-sxm-80gb"))
    # a study made before the record: which fields changed (its price among them) is unknown
    assert "--cluster another profile, or new contents or price -> h100-sxm-80gb" in text
    # the H100 also settles precision: auto otherwise: not the profile alone
    assert text.endswith("rerun that exact command, or use another --study name")
    study = open_study(_req(db), "random")  # the same request resumes, and records its profile
    assert study.user_attrs[PROFILE_ATTR]["name"] == "a100-sxm4-80gb"
    assert "--cluster a100-sxm4-80gb -> h100-sxm-80gb" in _refusal(_req(db, "h100-sxm-80gb"))


def test_a_fingerprint_that_held_the_profile_typed_names_it(tmp_path) -> None:
    """The first stored studies held the --cluster reference as typed beside the hash."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = _req(db)
    _older_study(db, req)
    study = optuna.load_study(study_name="s1", storage=db)
    typed = json.loads(study.user_attrs[FINGERPRINT_ATTRS["search"]]) | {
        "profile": "a100-sxm4-80gb"}
    study.set_user_attr(FINGERPRINT_ATTRS["search"], json.dumps(typed, sort_keys=True))
    assert "--cluster a100-sxm4-80gb -> h100-sxm-80gb" in _refusal(_req(db, "h100-sxm-80gb"))


def test_the_precision_hint_only_where_it_alone_resumes() -> None:
    alone = mismatch("s1", ['space.precision ["bf16"] -> ["bf16", "fp8"]'], auto_precision=True)
    assert "give a space that lists the study's precision ([\"bf16\"])" in str(alone)
    both = mismatch("s1", ['space.precision ["bf16"] -> ["bf16", "fp8"]',
                           "--global-batch-size 8 -> 16"], auto_precision=True)
    assert "lists the study's precision" not in str(both)
    assert str(both).endswith("rerun that exact command, or use another --study name")


def test_a_profile_file_named_by_path_that_changed_gets_no_cluster_hint(tmp_path) -> None:
    """--cluster PATH whose file now holds other figures: the study's reference no longer
    gives its profile, so no --cluster is suggested; given by that path again, the profile is
    what to restore."""
    src = load_profile("a100-sxm4-80gb")
    path = tmp_path / "mine.yaml"
    from autoplan.yaml_io import dump_yaml, to_dict

    data = {"schema_version": 1, **to_dict(src)}
    path.write_text(dump_yaml(data), encoding="utf-8")
    db = f"sqlite:///{tmp_path / 's.db'}"
    mine = dataclasses.replace(_req(db), profile=load_profile(str(path)), profile_ref=str(path))
    open_study(mine, "random")
    data["gpus_per_node"] = 4
    path.write_text(dump_yaml(data), encoding="utf-8")
    text = _refusal(_req(db, "h100-sxm-80gb"))
    assert "--cluster a100-sxm4-80gb -> h100-sxm-80gb" in text
    assert text.endswith("rerun that exact command, or use another --study name")  # + precision
    data["gpus_per_node"] = 8
    data["price_per_gpu_hour"] = 99.0
    path.write_text(dump_yaml(data), encoding="utf-8")
    data["gpus_per_node"] = 4
    path.write_text(dump_yaml(data), encoding="utf-8")
    again = dataclasses.replace(_req(db), profile=load_profile(str(path)), profile_ref=str(path))
    assert _refusal(again).endswith("the profile changed since the study was made: restore it to resume, or use another --study name")  # the same command: the file is what changed


def test_the_cluster_hint_ignores_a_price_as_resume_does(tmp_path) -> None:
    """A study made at another price of its profile: the --cluster it names resumes it, as a
    price-only change does, so the hint is given."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    req = _req(db)
    priced = dataclasses.replace(req, profile=dataclasses.replace(req.profile,
                                                                    price_per_gpu_hour=9.0))
    open_study(priced, "random")
    text = _refusal(_req(db, "h100-sxm-80gb"))
    assert text.endswith("to resume, give --cluster a100-sxm4-80gb (the study's profile), or "
                         "use another --study name")
    open_study(req, "random")  # and it does


def test_a_reworded_space_description_resumes_but_a_knob_does_not(tmp_path) -> None:
    """A space's one-line description, like a profile's, holds no figure a trial stored."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    open_study(_req(db), "random")
    reworded = {**AUTO, "description": "my own words"}
    open_study(_req(db, space=reworded), "random")  # resumes
    knob = {**AUTO, "description": "my own words", "micro_batch_size": [1, 2, 4, 8]}
    assert "space.micro_batch_size" in _refusal(_req(db, space=knob))
