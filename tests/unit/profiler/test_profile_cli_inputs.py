"""`autoplan profile` (profiler.cli): a base profile of another device, an empty --out or
--name, and an --out that `--cluster` cannot read back are refused before measuring."""

from __future__ import annotations

import pytest
import torch

from autoplan.commands import build_parser, main
from autoplan.profiler import cli


@pytest.fixture
def no_measuring(monkeypatch, tmp_path):
    """Measuring fails the test; the default output folder is an empty tmp_path."""

    def measure(*_):
        pytest.fail("measured before refusing the request")

    monkeypatch.setattr(cli, "_measure", measure)
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _on_gpu(monkeypatch, name: str = "NVIDIA H100 80GB HBM3") -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: name)


def _refused(argv: list[str], capsys) -> str:
    assert main(["profile", "--quick", "--ranks", "1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_gpu_base_on_a_cpu_host_is_refused(monkeypatch, no_measuring, capsys) -> None:
    """It wrote a profile with the A100's 80 GiB, fp16 peak, 108 SMs and 8 GPUs per node
    beside this CPU's measurements."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = no_measuring / "x.yaml"
    err = _refused(["--base", "a100-sxm4-80gb", "--out", str(out)], capsys)
    assert "--base: a100-sxm4-80gb describes a100, but this run measures cpu" in err
    assert "cpu-gloo" in err and not out.exists()


@pytest.mark.parametrize(("base", "want"), [("cpu-gloo", "cpu"), ("a100-sxm4-80gb", "a100")])
def test_a_base_of_another_device_on_a_gpu_is_refused(monkeypatch, no_measuring, capsys,
                                                       base, want) -> None:
    _on_gpu(monkeypatch)
    out = no_measuring / "x.yaml"
    err = _refused(["--device", "cuda", "--base", base, "--out", str(out)], capsys)
    assert f"--base: {base} describes {want}, but this run measures NVIDIA H100" in err
    assert not out.exists()


@pytest.mark.parametrize(("gpu", "base"), [("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
                                           ("NVIDIA H800", "h800-sxm-80gb"),
                                           ("NVIDIA A100-SXM4-40GB", "a100-sxm4-80gb")])
def test_the_default_base_matches_the_gpu(monkeypatch, tmp_path, gpu, base) -> None:
    _on_gpu(monkeypatch, gpu)
    monkeypatch.setenv("AUTOPLAN_PROFILES", str(tmp_path))  # without --out: written there
    monkeypatch.chdir(tmp_path)
    req = cli._request(build_parser().parse_args(["profile"]))
    assert req.base["name"] == base and req.name == f"{base}-measured"
    assert req.out == tmp_path / f"{base}-measured.yaml"


@pytest.mark.parametrize(("argv", "needle"), [
    (["--out", ""], "--out: is empty"),
    (["--out", " "], "--out: is empty"),
    (["--name", ""], "--name: is empty"),
    (["--name", "", "--out", "p.yaml"], "--name: is empty"),
])
def test_empty_out_or_name_is_refused(no_measuring, capsys, argv, needle) -> None:
    """`--out ''` was taken as not given and wrote NAME.yaml into the default folder (the
    checkout's profiles/); `--name ''` became cpu-measured."""
    assert needle in _refused(["--device", "cpu", *argv], capsys)
    assert list(no_measuring.iterdir()) == []


@pytest.mark.parametrize("out", ["my-machine", "sub/my-machine", "p.json"])
def test_an_out_without_a_yaml_suffix_is_refused(no_measuring, capsys, out) -> None:
    """`--out my-machine` wrote a file that `--cluster my-machine` then looked up as a packaged
    profile name and refused."""
    err = _refused(["--device", "cpu", "--out", out], capsys)
    assert f"--out: {out!r} does not end in .yaml or .yml" in err
    assert "bare word" in err and list(no_measuring.iterdir()) == []


@pytest.mark.parametrize("out", ["p.yaml", "p.yml", "P.YAML"])
def test_yaml_suffixes_are_accepted(out) -> None:
    cli.check_out_and_name(out, None)
