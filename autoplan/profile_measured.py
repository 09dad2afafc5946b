"""A profile's `measured:` section: the keys `autoplan profile` and `autoplan calibrate` write,
checked on load, and the compute multiplier a calibration record holds. hardware.py's
ClusterProfile checks its section here."""

from __future__ import annotations

import math
from typing import Any

from autoplan.errors import ConfigError
from autoplan.hardware_devices import key_field
from autoplan.yaml_io import show, unknown_key_fix

MEASURED_KEYS = ("date", "torch", "device", "precision", "quick", "threads_per_rank", "matmul",
                 "copy_bytes_per_s", "elementwise_bytes_per_s", "op_overhead_s", "collectives",
                 "host_copy_bytes_per_s", "cpu_adam_params_per_s")
"""Keys of `measured` that `autoplan profile` always writes (profiler/build.py assemble)."""
MEASURED_EXTRA_KEYS = ("layer_models", "layers", "saved_activations", "matmul_from_layers",
                       "dispatch", "calibration", "fp8_matmul")
"""Keys it writes when it measured them (build.py), and `autoplan calibrate`'s record."""
MEASURED_ALONE_KEYS = ("dispatch", "precision", "calibration")
"""Sections written into any profile on their own (profiler dispatch.apply_dispatch and
precision.apply_precision, `autoplan calibrate` on a datasheet profile): a `measured` holding
only these needs none of MEASURED_KEYS' others."""


def device_compute(measured: dict[str, Any] | None) -> float:
    """The compute multiplier between a calibrated profile's peak and its device's own:
    `autoplan calibrate`'s record (measured.calibration.device_compute, every fit in a chain;
    factors.compute in records of one fit written before it); 1 without a record."""
    calibration = (measured or {}).get("calibration")
    if calibration is None:
        return 1.0
    if not isinstance(calibration, dict):
        raise ConfigError("measured.calibration", f"got {show(calibration)}",
                          "expected the mapping `autoplan calibrate` wrote")
    factors = calibration.get("factors")
    if factors is not None and not isinstance(factors, dict):
        raise ConfigError("measured.calibration.factors", f"got {show(factors)}",
                          "expected the mapping of factors `autoplan calibrate` wrote")
    field, value = (("device_compute", calibration["device_compute"])
                    if "device_compute" in calibration
                    else ("factors.compute", (factors or {}).get("compute", 1.0)))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise ConfigError(f"measured.calibration.{field}", f"got {value!r}",
                          "expected the positive multiplier `autoplan calibrate` wrote")
    return float(value)


def check_measured(measured: dict[str, Any]) -> None:
    """`measured` holds what `autoplan profile` writes, or only sections of MEASURED_ALONE_KEYS:
    its presence turns off the datasheet GEMM quantization (cost.compute.gemm_time_s), so a
    stray or empty section must not."""
    known = MEASURED_KEYS + MEASURED_EXTRA_KEYS
    for key in measured:
        if key not in known:
            raise ConfigError(f"measured.{key_field(key)}", "unknown key",
                              unknown_key_fix(key, known))
    device_compute(measured)  # a calibration record's multiplier, checked
    if measured and set(measured) <= set(MEASURED_ALONE_KEYS):
        return
    missing = [k for k in MEASURED_KEYS if k not in measured]
    if missing:
        raise ConfigError("measured", f"lacks {', '.join(missing)}" if measured else "is empty",
                          "keep the section `autoplan profile` wrote whole, or delete it")
