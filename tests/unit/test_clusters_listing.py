"""`autoplan clusters` over a user's profile folder (user test 35, findings 6 and 14): a
calibrated profile is listed at the peak plans are priced at (it showed the pre-fit one), and
the runtime-traits files, plans and model specs kept beside the profiles are said in one line,
not warned about as broken profiles."""

from __future__ import annotations

import json

import pytest

from autoplan.commands import main
from autoplan.estimate_cli import three
from autoplan.hardware import PROFILES_DIR
from autoplan.yaml_io import dump_yaml, read_yaml

CPU = read_yaml(PROFILES_DIR / "cpu-gloo.yaml", "profile")


def _calibrated(factor: float) -> dict:
    """cpu-gloo as `autoplan calibrate` writes it after a compute fit of `factor`."""
    dev = CPU["device"]
    return {**CPU, "name": "fitted",
            "device": {**dev, "peak_flops_per_s": {k: float(v) * factor
                                                   for k, v in dev["peak_flops_per_s"].items()}},
            "measured": {"calibration": {"device_compute": factor}}}


def test_a_calibrated_profile_is_listed_at_the_peak_it_prices(tmp_path, monkeypatch,
                                                               capsys) -> None:
    (tmp_path / "fitted.yaml").write_text(dump_yaml(_calibrated(0.28)))
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "120")
    own = float(CPU["device"]["peak_flops_per_s"]["fp32"]) / 1e12
    assert main(["clusters", "--format", "json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "fitted")
    assert row["peak_tflops"]["fp32"] == pytest.approx(own)  # the device's: MFU's
    assert row["priced_peak_tflops"]["fp32"] == pytest.approx(own * 0.28)  # the cost model's
    assert row["calibrated_compute"] == 0.28
    assert main(["clusters", "--format", "table"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.strip().startswith("fitted"))
    assert f" {three(own * 0.28)} " in line and f" {three(own)} " not in line, line
    assert "calibrated" in line


def test_other_autoplan_files_beside_the_profiles_are_said_in_one_line(tmp_path, monkeypatch,
                                                                       capsys) -> None:
    """Each runtime-traits file read as a broken profile: `profile r1 ...base: unknown key`."""
    (tmp_path / "mine.yaml").write_text(dump_yaml({**CPU, "name": "mine"}))
    (tmp_path / "r1.yaml").write_text("schema_version: 1\nname: r1\nbase: megatron\n"
                                      "fused_swiglu: false\n")
    (tmp_path / "r9.yaml").write_text("name: r9\nfused_norm: true\n")  # no base: a traits key
    (tmp_path / "plan.yaml").write_text("model: tiny\ncluster: {profile: cpu-gloo, num_gpus: 1}"
                                        "\nbatch: {micro_batch_size: 1, global_batch_size: 1}\n")
    (tmp_path / "m.yaml").write_text("name: m\nnum_layers: 2\nhidden_size: 64\n")
    (tmp_path / "typo.yaml").write_text(dump_yaml({**CPU, "name": "typo", "gpus_per_nodes": 8}))
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    assert main(["clusters", "--format", "json"]) == 0
    captured = capsys.readouterr()
    names = {r["name"] for r in json.loads(captured.out)}
    assert "mine" in names and not names & {"r1", "r9", "plan", "m", "typo"}
    err = captured.err.splitlines()
    assert err == [
        f"autoplan clusters: warning: skipped {tmp_path / 'typo.yaml'}: profile typo "
        f"({tmp_path / 'typo.yaml'}).gpus_per_nodes: unknown key; did you mean 'gpus_per_node'?"
        " valid keys: name, device, gpus_per_node, intra_node, inter_node, host, efficiency, "
        "description, collectives, measured, price_per_gpu_hour",
        f"autoplan clusters: skipped 4 file(s) of {tmp_path} that are no profiles: m.yaml (a "
        "model spec), plan.yaml (a plan), r1.yaml (runtime traits, for --runtime), r9.yaml "
        "(runtime traits, for --runtime)"]


def test_each_stray_file_is_said_with_the_folder_it_was_found_in(tmp_path, monkeypatch,
                                                                 capsys) -> None:
    """A plan in the packaged profiles/ folder was said as a file of the user's folder, which
    need not even exist (review finding H1.2)."""
    from autoplan import resources

    user, packaged = tmp_path / "user", tmp_path / "packaged"
    user.mkdir()
    packaged.mkdir()
    (packaged / "cpu-gloo.yaml").write_text(dump_yaml(CPU))
    (packaged / "plan.yaml").write_text("model: tiny\ncluster: {profile: cpu-gloo, num_gpus: 1}\n"
                                        "batch: {micro_batch_size: 1, global_batch_size: 1}\n")
    (user / "m.yaml").write_text("name: m\nnum_layers: 2\nhidden_size: 64\n")
    real = resources.package_dir
    monkeypatch.setattr(resources, "package_dir",
                        lambda kind: packaged if kind is resources.PROFILES else real(kind))
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(user))
    assert main(["clusters", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert [r["name"] for r in json.loads(captured.out)] == ["cpu-gloo"]
    assert captured.err.splitlines() == [
        f"autoplan clusters: skipped 1 file(s) of {user} that are no profiles: m.yaml (a model "
        "spec)",
        f"autoplan clusters: skipped 1 file(s) of {packaged} that are no profiles: plan.yaml (a "
        "plan)"]
    (user / "m.yaml").unlink()
    user.rmdir()  # no user folder at all: the packaged stray is still said where it is
    assert main(["clusters", "--format", "json"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"autoplan clusters: skipped 1 file(s) of {packaged} that are no profiles: plan.yaml (a "
        "plan)"]
