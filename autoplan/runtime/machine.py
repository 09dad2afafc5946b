"""The machine a run actually trains on (device and backend), for the summary and the run
record, and a warning when the plan's profile describes another device (calibrate.py decides
what counts as the same device)."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


def machine_info(device: torch.device, backend: str) -> dict[str, Any]:
    """`device`: `cpu` or the GPU's name as torch gives it; `backend`: the process group's."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "device_type": device.type, "backend": backend}


def local_device() -> str:
    """The device `autoplan train` trains on here: the first CUDA GPU's name, else `cpu`."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


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
