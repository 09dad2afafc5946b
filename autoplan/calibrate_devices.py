"""Which device a profile and a run record describe (device_model, device_token: runtime,
tune, export and profile ask it too), and check_runs: the runs calibrate refuses before a fit."""

from __future__ import annotations

import os
import re
from pathlib import Path

from autoplan import resources
from autoplan.calibrate_runs import RunRecord
from autoplan.errors import ConfigError
from autoplan.hardware import ClusterProfile, load_profile
from autoplan.yaml_io import show


def profile_file(ref: str) -> Path | None:
    """The file a profile reference names (a name: the user's directory, then the built-in
    ones; else a path), resolved; None when there is none."""
    if resources.is_name(ref):
        found = resources.find(resources.PROFILES, ref)
        return found.resolve() if found is not None else None
    path = Path(ref).expanduser()
    try:
        return path.resolve() if path.is_file() else None
    except OSError:  # a name past NAME_MAX
        return None


def device_model(profile: ClusterProfile) -> str:
    """The device a profile describes, as runs on it would share it: `cpu` for a CPU host,
    else the GPU's model token (a100, h100, mi300x): the datasheet's `H100-SXM5-80GB` and
    torch's `NVIDIA H100 80GB HBM3` (a profile `autoplan profile` measured) are both h100."""
    if profile.is_cpu:
        return "cpu"
    return device_token(profile.device.name)


def device_token(name: str) -> str:
    """A device name as device_model compares it: `cpu`, or the GPU model's first word with a
    digit (`NVIDIA A100-SXM4-80GB` and `A100-SXM4-80GB` are both a100)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    if words == ["cpu"]:
        return "cpu"
    return next((w for w in words if any(c.isdigit() for c in w)), " ".join(words))


def check_runs(runs: list[RunRecord], profile_ref: str, profile: ClusterProfile) -> None:
    """Refuse a run that trained on another device than `profile`'s (--profile;
    machine.device: a GPU plan run on a CPU host calibrates a CPU profile, not the GPU one),
    a run without machine.device recorded on a profile of another device or on a profile that
    does not exist here, and a run file given twice (it would count twice).
    A profile measured or calibrated from the run's one (same device) is what calibrate is
    for: runs recorded on cpu-gloo fit the profile `autoplan profile` measured on that host."""
    want = device_model(profile)
    seen: dict[tuple[int, int], str] = {}
    for run in runs:
        st = os.stat(run.source)
        if (st.st_dev, st.st_ino) in seen:
            raise ConfigError(f"RUN {run.source}", f"is the same file as "
                              f"{seen[(st.st_dev, st.st_ino)]}", "give each run record once")
        seen[(st.st_dev, st.st_ino)] = run.source
        _check_peak(run, profile_ref, profile)
        if run.device is not None and device_token(run.device) != want:
            raise ConfigError(
                f"RUN {run.source}: machine.device", f"the run trained on {show(run.device)}, "
                f"not on the {want} that --profile {show(profile_ref)} describes",
                f"fit a profile of {device_token(run.device)} to it (runs measure the device "
                "they ran on)")
        if run.profile is None or run.device is not None:
            # the device it trained on, when recorded, is what the measurement measured: a
            # plan made for another profile and run here calibrates this machine's profile
            continue
        if profile_file(run.profile) is None:
            raise ConfigError(f"RUN {run.source}", f"recorded on profile {show(run.profile)}, "
                              "which is neither a known profile nor a file",
                              f"calibrate with runs recorded on --profile {profile_ref}")
        recorded = load_profile(run.profile, f"RUN {run.source}: profile")
        if device_model(recorded) != want:
            raise ConfigError(
                f"RUN {run.source}", f"recorded on profile {show(run.profile)} "
                f"({recorded.device.name}), not on --profile {show(profile_ref)} "
                f"({profile.device.name})", "fit a profile only to runs measured on its device")


def _check_peak(run: RunRecord, profile_ref: str, profile: ClusterProfile) -> None:
    """A measured peak above the device's memory: the fit would raise the reserved bytes past
    the memory itself, a profile no run can fit on."""
    peak, memory = run.measured.peak_memory_bytes, profile.device.memory_bytes
    if peak is not None and peak > memory:
        raise ConfigError(f"RUN {run.source}: measured.peak_memory_bytes",
                          f"{peak:.4g} bytes, above the {memory} bytes of the "
                          f"{profile.device.name} of --profile {show(profile_ref)}",
                          "check the record: a run cannot peak above its device's memory, "
                          "or fit a profile of the device it ran on")
