"""CPU offload: PCIe traffic and CPU optimizer time (ZeRO-Offload, Ren et al. 2021, section 4;
ZeRO-Infinity, Rajbhandari et al. 2021, for parameters).

Optimizer offload sends each step's gradient shard to the host (overlapped with backward), runs
Adam on the CPU, and copies the updated 16-bit weights back. Parameter offload streams the weight
shard to the GPU in forward and again in backward, for every micro-batch.
"""

from __future__ import annotations

import numpy as np

from autoplan.hardware import ClusterProfile


def optimizer_offload_time_s(
    shard_params: np.ndarray, gpus_per_host: np.ndarray, weight_bytes: float,
    profile: ClusterProfile, hideable_s: np.ndarray,
) -> np.ndarray:
    """Exposed seconds per step: CPU Adam on this GPU's shard (the host's optimizer throughput
    is shared by its GPUs), the weight copy back, and the gradient copy not hidden by backward."""
    shard = np.asarray(shard_params, float)
    pcie = profile.host.pcie_bytes_per_s
    cpu = shard / (profile.host.optimizer_params_per_s / np.asarray(gpus_per_host, float))
    grads_down = shard * weight_bytes / pcie
    weights_up = shard * weight_bytes / pcie
    return cpu + weights_up + np.maximum(0.0, grads_down - hideable_s)


def param_offload_time_s(
    shard_params: np.ndarray, microbatches: np.ndarray, weight_bytes: float,
    profile: ClusterProfile, hideable_s: np.ndarray,
) -> np.ndarray:
    """Exposed seconds per step of streaming the weight shard in for forward and backward."""
    total = 2.0 * np.asarray(microbatches, float) * np.asarray(shard_params, float) * weight_bytes
    return np.maximum(0.0, total / profile.host.pcie_bytes_per_s - hideable_s)
