"""`--plan FILE`: a file that is no plan is named as what it is, and a plan file's own fields are
named as its fields, not as flags the user never gave (autoplan/plan_files.py)."""

from __future__ import annotations

import yaml

from autoplan.commands import main


def _written(tmp_path, name: str, data: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_file_that_is_no_plan_is_named_as_what_it_is(tmp_path, capsys) -> None:
    """A search's top.yaml, a run record and a file of stray keys all said '--model: missing'."""
    plan = {"model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 2},
            "batch": {"micro_batch_size": 1, "global_batch_size": 2}}
    top = _written(tmp_path, "top.yaml", {"schema_version": 1, "plans": [plan, plan]})
    record = _written(tmp_path, "run.json", {"plan": plan, "measured": {"step_time_s": 1.0}})
    stray = _written(tmp_path, "foo.yaml", {"schema_version": 1, "foo": 1})
    for path, says in ((top, "is a list of 2 plans (a search's top.yaml); pass one plan"),
                       (record, "is a run record, whose plan is under `plan:`"),
                       (stray, None)):
        assert main(["estimate", "--plan", path]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "--model" not in err[0]
        assert (says in err[0]) if says else err[0].startswith(
            "autoplan estimate: error: foo: unknown key; valid keys: model, cluster")


def test_a_plan_file_s_unknown_profile_is_named_as_its_field(tmp_path, capsys) -> None:
    plan = _written(tmp_path, "p.yaml", {
        "model": "tiny", "cluster": {"profile": "a100", "num_gpus": 2},
        "batch": {"micro_batch_size": 1, "global_batch_size": 2}})
    assert main(["estimate", "--plan", plan]) == 2
    assert "error: cluster.profile: unknown profile 'a100'" in capsys.readouterr().err
    assert main(["estimate", "--plan", plan, "--cluster", "a100x"]) == 2
    assert "error: --cluster: unknown profile 'a100x'" in capsys.readouterr().err
