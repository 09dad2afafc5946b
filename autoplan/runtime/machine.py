"""The machine a run actually trains on (device, backend, memory), for the summary, the run
record and the launcher's host check, the host's load while it trained, and a warning when the
plan's profile describes another device (calibrate_devices.py decides what counts as the same
device)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def machine_info(device: torch.device, backend: str) -> dict[str, Any]:
    """`device`: `cpu` or the GPU's name as torch gives it; `backend`: the process group's."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "device_type": device.type, "backend": backend}


def load_average() -> list[float] | None:
    """The host's load averages over 1, 5 and 15 minutes (os.getloadavg), None where the OS
    has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def host_load(start: list[float] | None, end: list[float] | None) -> dict[str, Any]:
    """The load a run shared the host with, for the summary and the run record: the load
    averages when it started and when it ended (its own ranks count in them) and the CPUs
    they are shared by, so a step measured on a busy machine can be told apart."""
    return {"cpu_count": os.cpu_count(), "load_avg_start": start, "load_avg_end": end}


def local_device() -> str:
    """The device `autoplan train` trains on here: the first CUDA GPU's name, else `cpu`."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def local_gpu_count() -> int:
    """CUDA GPUs this host gives one node's NCCL ranks (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""A container's memory limit (cgroup v2, then v1): "max" or a huge number when unlimited."""


def host_memory_bytes() -> int:
    """The memory every rank of a CPU run shares: the host's physical memory, or the
    container's cgroup limit where that is lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in CGROUP_LIMITS:
        try:
            limit = int(path.read_text().strip())
        except (OSError, ValueError):  # absent, unreadable, or "max"
            continue
        total = min(total, limit)
    return total


def device_mismatch(profile_ref: str, machine: dict[str, Any]) -> str | None:
    """One line when the run's device is not the one `profile_ref` (the plan's profile)
    describes; None when it is, or when the profile cannot be loaded here."""
    from autoplan.calibrate import device_model, device_token
    from autoplan.errors import ConfigError
    from autoplan.hardware import load_profile

    try:
        want = device_model(load_profile(profile_ref, "cluster.profile"))
    except ConfigError:
        return None
    got = device_token(machine["device"])
    if got == want:
        return None
    return (f"the plan's profile {profile_ref} describes {want}, but this run trains on "
            f"{machine['device']} ({machine['backend']}): measured and predicted will differ, "
            f"and `autoplan calibrate` fits only a {got} profile to its run record")
