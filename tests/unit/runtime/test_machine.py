"""The device a run trains on, against the one its plan's profile describes: `train` warns in
one line when they differ (a GPU plan trained on a CPU host said nothing)."""

from __future__ import annotations

import torch

from autoplan.runtime.machine import device_mismatch, machine_info


def test_a_gpu_profile_on_a_cpu_host_is_one_warning_line() -> None:
    cpu = machine_info(torch.device("cpu"), "gloo")
    assert cpu == {"device": "cpu", "device_type": "cpu", "backend": "gloo"}
    line = device_mismatch("a100-sxm4-80gb", cpu)
    assert line is not None and "\n" not in line
    assert "a100-sxm4-80gb describes a100" in line and "trains on cpu (gloo)" in line
    assert device_mismatch("cpu-gloo", cpu) is None


def test_the_gpu_named_by_torch_matches_its_datasheet_profile() -> None:
    gpu = {"device": "NVIDIA A100-SXM4-80GB", "device_type": "cuda", "backend": "nccl"}
    assert device_mismatch("a100-sxm4-80gb", gpu) is None
    line = device_mismatch("h100-sxm-80gb", gpu)
    assert line is not None and "describes h100" in line
    assert device_mismatch("no-such-profile", gpu) is None  # train refused it already
