"""Pipeline schedules: micro-batches in flight (memory) and the bubble (time).

GPipe keeps every micro-batch in flight (Huang et al. 2019); 1F1B at most pp on stage 0
(Narayanan et al. 2021, PipeDream-Flush); interleaving with v chunks keeps
pp * (1 + (pp-1)/(pp*v)) layer-sets (Korthikanti et al. 2022, section 4.2.3). Bubble: (pp-1)/m of
the ideal time for GPipe and 1F1B, (pp-1)/(v*m) interleaved (Narayanan et al. 2021, section 2.2);
zero-bubble ZB-H1 leaves about a third of 1F1B's (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism", Table 3), and its V schedule with two chunks less still. DualPipe (DeepSeek-V3
report §3.2.1, Table 2; deepseek-ai/DualPipe dualpipe.py) pairs stages i and pp-1-i on rank i:
its bubble and in-flight counts are dualpipe_bubble_s and dualpipe_in_flight.
"""

from __future__ import annotations

import numpy as np

from autoplan.plan_table import GPIPE, INTERLEAVED, ZERO_BUBBLE

ZERO_BUBBLE_SHARE = 1.0 / 3.0
"""Zero-bubble's bubble as a share of 1F1B's: ZB-H1 idles (p-1)(T_F + T_B - T_W) where 1F1B
idles (p-1)(T_F + T_B + T_W) (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §2.1 and
Fig. 3: one third of 1F1B's), read at T_F = T_B = T_W, the paper's handcrafted-schedule
assumption. Divided by the chunk count for the V schedules (pipeline
bubble_fraction). Recompute inside B (T_B grows by a forward) would raise the share toward
1/2; not priced."""


def in_flight_microbatches(
    schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
) -> np.ndarray:
    """Micro-batches' worth of activations stage 0 holds at its peak (in units of its layers)."""
    pp, vpp, m = (np.asarray(x, float) for x in (pp, vpp, m))
    sched = np.asarray(schedule)
    one_f_one_b = np.minimum(pp, m)
    interleaved = np.minimum(m, pp * (1.0 + (pp - 1.0) / (pp * vpp)))
    # zero-bubble with one chunk (ZB-H1) or two in V order (ZB-V) keeps 1F1B's peak (Qi et al.
    # 2023 §3, 2024); with three or more chunks torch's ScheduleInterleavedZeroBubble warms up
    # as interleaved 1F1B does, so it holds interleaving's extra (pp-1)/(pp*v) share
    out = np.where(sched == GPIPE, m, np.where(warms_interleaved(sched, vpp), interleaved,
                                              one_f_one_b))
    return np.where(pp > 1, out, 1.0)


def in_flight_last_rank(
    schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
) -> np.ndarray:
    """Micro-batches' worth of activations the last pipeline rank holds at its peak (in units
    of its layers): GPipe all m; a schedule that warms up as interleaved 1F1B does
    ((pp - rank - 1) * 2 + (vpp - 1) * pp chunk forwards before its first backward, plus the
    one in flight: Megatron-Core's get_pp_rank_microbatches, torch's
    ScheduleInterleaved1F1B) (vpp - 1) * pp + 1 chunks, pp - (pp - 1)/vpp of its layer sets;
    1F1B's last rank one."""
    pp, vpp, m = (np.asarray(x, float) for x in (pp, vpp, m))
    sched = np.asarray(schedule)
    interleaved = np.minimum(m, pp - (pp - 1.0) / np.maximum(vpp, 1.0))
    return np.where(sched == GPIPE, m, np.where(warms_interleaved(sched, vpp), interleaved, 1.0))


def warms_interleaved(schedule: np.ndarray, vpp: np.ndarray) -> np.ndarray:
    """Schedules that warm up as interleaved 1F1B does: interleaved itself, and zero-bubble
    with three or more chunks (torch's ScheduleInterleavedZeroBubble)."""
    sched = np.asarray(schedule)
    return (sched == INTERLEAVED) | ((sched == ZERO_BUBBLE) & (np.asarray(vpp) >= 3))


def bubble_fraction(
    schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
) -> np.ndarray:
    """Idle time as a fraction of the ideal (bubble-free) pipeline time m * t_microbatch."""
    pp, vpp, m = (np.asarray(x, float) for x in (pp, vpp, m))
    sched = np.asarray(schedule)
    base = (pp - 1.0) / np.maximum(m, 1.0)
    out = np.where(sched == INTERLEAVED, base / vpp,
                   np.where(sched == ZERO_BUBBLE, base * ZERO_BUBBLE_SHARE / vpp, base))
    return np.where(pp > 1, out, 0.0)


def dualpipe_bubble_s(pp: np.ndarray, forward: np.ndarray, backward: np.ndarray,
                      weight: np.ndarray) -> np.ndarray:
    """DualPipe's idle seconds per step, (pp/2 - 1)(F&B + B - 3W) (DeepSeek-V3 report Table 2)
    with F&B = F + B (an overlapped forward-backward pair computes both): (pp/2 - 1)(F + 2B -
    3W), for the slowest rank's forward, backward and weight-gradient seconds per micro-batch
    (W at most B); 0 without a pipeline."""
    pp = np.asarray(pp, float)
    w = np.minimum(weight, backward)
    return np.maximum(pp / 2.0 - 1.0, 0.0) * (forward + 2.0 * backward - 3.0 * w)


def dualpipe_in_flight(pp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Micro-batches a DualPipe rank holds at its peak: (of the first stage, of the last, of a
    middle rank's two stages together) for the end rank pair and a middle rank. Rank i < pp/2
    peaks at pp - i of stage i and i + 1 of stage pp-1-i (dualpipe.py step(): 2(pp/2 - i - 1)
    forwards of phase 0, i + 1 of each phase, then the main loop's first F0 before its B0):
    rank 0 pp of the first and one of the last, a middle rank pp + 1 of its two."""
    pp = np.asarray(pp, float)
    return pp, np.ones_like(pp), pp + 1.0
