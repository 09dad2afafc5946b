"""Memory terms against the published figures they come from."""

from __future__ import annotations

import numpy as np
import pytest

from autoplan.cost import memory


@pytest.mark.parametrize(
    ("zero", "expected_gb"),
    # Rajbhandari et al. 2020 (ZeRO), Figure 1: 7.5B parameters, 64-way data parallelism,
    # K = 12: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB per device.
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_zero_model_states_match_zero_paper(zero: int, expected_gb: float) -> None:
    st = memory.model_state_bytes(np.array(7.5e9), np.array(zero), np.array(64), "fp16",
                                  grad_bytes=2.0)  # the paper's 16-bit gradients
    total = float(st["params"] + st["grads"] + st["optimizer"])
    assert total / 1e9 == pytest.approx(expected_gb, rel=0.02)


@pytest.mark.parametrize(("zero", "bytes_per_param"), [(0, 18.0), (1, 6.0 + 12.0 / 8)])
def test_default_mixed_precision_keeps_fp32_gradients_like_megatron(zero, bytes_per_param):
    # Megatron-Core distributed optimizer docs: 18 bytes per parameter without it,
    # 6 + 12/d with it (bf16 weights, fp32 main_grad, fp32 master + Adam sharded over d).
    st = memory.model_state_bytes(np.array(1e9), np.array(zero), np.array(8), "bf16")
    assert float(st["params"] + st["grads"] + st["optimizer"]) == pytest.approx(
        1e9 * bytes_per_param)


def test_pipelined_zero3_accumulates_unsharded() -> None:
    plain = memory.model_state_bytes(np.array(1e9), np.array(3), np.array(8), "bf16")
    acc = memory.model_state_bytes(np.array(1e9), np.array(3), np.array(8), "bf16",
                                   unsharded_accumulation=np.array(True))
    assert float(acc["grads"]) == 8 * float(plain["grads"]) == 4e9
    assert float(acc["params"]) == 8 * float(plain["params"]) == 2e9
    assert float(acc["optimizer"]) == float(plain["optimizer"])


def test_offload_moves_optimizer_and_grads_to_host() -> None:
    st = memory.model_state_bytes(np.array(1e9), np.array(2), np.array(1), "bf16",
                                  offload_optimizer=np.array(True))
    assert float(st["optimizer"]) == 0 and float(st["grads"]) == 0
    assert float(st["params"]) == 2e9
    host = memory.host_state_bytes(np.array(1e9), np.array(1), "bf16", np.array(True),
                                   np.array(False))
    assert float(host) == 16e9  # 12 bytes of Adam states + 4 of fp32 gradient per parameter
