"""Pipeline schedules: micro-batches in flight (memory) and the bubble (time).

GPipe keeps every micro-batch in flight (Huang et al. 2019); 1F1B at most pp on stage 0
(Narayanan et al. 2021, PipeDream-Flush); interleaving with v chunks keeps
pp * (1 + (pp-1)/(pp*v)) layer-sets (Korthikanti et al. 2022, section 4.2.3). Bubble: (pp-1)/m of
the ideal time for GPipe and 1F1B, (pp-1)/(v*m) interleaved (Narayanan et al. 2021, section 2.2);
zero-bubble ZB-H1 leaves about a third of 1F1B's (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism", Table 3), and its V schedule with two chunks less still. DualPipe (DeepSeek-V3
report §3.2.1, Table 2; deepseek-ai/DualPipe dualpipe.py) pairs stages i and pp-1-i on rank i:
its bubble and in-flight counts are dualpipe_bubble_s and dualpipe_in_flight. torch's
zero-bubble schedules keep each micro-batch's activations until its deferred weight-gradient
step, on every rank: zero_bubble_held and deferred_weight_grads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoplan.plan_table import GPIPE, INTERLEAVED, ONE_F_ONE_B, ZERO_BUBBLE

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
    # zero-bubble keeps a micro-batch's activations until its deferred W (zero_bubble_held)
    out = np.where(sched == GPIPE, m, np.where(sched == INTERLEAVED, interleaved, one_f_one_b))
    out = np.where(sched == ZERO_BUBBLE, zero_bubble_held(pp, vpp, m, 0.0 * pp), out)
    return np.where(pp > 1, out, 1.0)


def in_flight_last_rank(
    schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
) -> np.ndarray:
    """Micro-batches' worth of activations the last pipeline rank holds at its peak (in units
    of its layers): GPipe all m; interleaved 1F1B ((pp - rank - 1) * 2 + (vpp - 1) * pp chunk
    forwards before its first backward, plus the one in flight: Megatron-Core's
    get_pp_rank_microbatches, torch's ScheduleInterleaved1F1B) (vpp - 1) * pp + 1 chunks,
    pp - (pp - 1)/vpp of its layer sets; 1F1B's last rank one; zero-bubble as
    zero_bubble_held counts it."""
    pp, vpp, m = (np.asarray(x, float) for x in (pp, vpp, m))
    sched = np.asarray(schedule)
    interleaved = np.minimum(m, pp - (pp - 1.0) / np.maximum(vpp, 1.0))
    out = np.where(sched == GPIPE, m, np.where(sched == INTERLEAVED, interleaved, 1.0))
    return np.where(sched == ZERO_BUBBLE, zero_bubble_held(pp, vpp, m, pp - 1.0), out)


def in_flight_middle_rank(
    schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray, m: np.ndarray,
) -> np.ndarray:
    """Micro-batches' worth a middle rank (an uneven split's heaviest, e.g. between 0-block end
    stages) holds of its layers: under 1F1B at most pp - 1 (rank k holds pp - k: Narayanan et
    al. 2021 §2.2); zero-bubble as zero_bubble_held counts rank pp - 2; else as many as rank 0
    (an upper bound)."""
    pp, vpp, m = (np.asarray(x, float) for x in (pp, vpp, m))
    sched = np.asarray(schedule)
    first = in_flight_microbatches(schedule, pp, vpp, m)
    one_f_one_b = np.maximum(np.minimum(pp - 1.0, m), 1.0)
    out = np.where((sched == ONE_F_ONE_B) & (vpp == 1), one_f_one_b, first)
    return np.where(sched == ZERO_BUBBLE, zero_bubble_held(pp, vpp, m, np.maximum(pp - 2.0, 0.0)),
                    out)


def zero_bubble_held(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray, rank: np.ndarray
                     ) -> np.ndarray:
    """Layer sets of activations pipeline rank `rank` keeps at its peak under torch's
    zero-bubble schedules, whose input-gradient step I (stage_backward_input) calls autograd
    with retain_graph=True: a micro-batch's saved tensors live until its weight-gradient step W
    (torch/distributed/pipelining/_backward.py; stage.py backward_weight_one_chunk frees them).
    ScheduleInterleavedZeroBubble (vpp 1 or >= 3; _get_warmup_ops and _get_1f1b_rank_ops with
    enable_zero_bubble) runs (vpp - 1) * R + pp - 1 - rank warm-up forwards (R =
    microbatches_per_round = m // max(1, m // pp)), then F, I and, after `rank` steady steps,
    W: (vpp - 1) * R + pp chunks on every rank, at most all m * vpp; in layer sets, min(pp, m)
    when pp divides m, whatever the rank. ScheduleZBVZeroBubble (vpp 2) keeps min(pp, (m + 1 +
    rank) / 2) on rank `rank` (replayed from its _calculate_single_rank_operations, pp 2-8, m
    pp to 4 pp: tests/unit/cost/test_memory_review.py). Both keep 1F1B's pp on rank 0 once m >=
    2 pp, as Qi et al. 2023 (ZB-H1) and 2024 (ZB-V) hold, but every later rank holds as much."""
    pp, vpp, m, rank = (np.asarray(x, float) for x in (pp, vpp, m, rank))
    rounds = np.maximum(1.0, np.floor(m / np.maximum(pp, 1.0)))
    per_round = np.floor(m / rounds)
    looped = np.minimum(m, ((vpp - 1.0) * per_round + pp) / np.maximum(vpp, 1.0))
    v_shape = np.minimum(np.minimum(m, pp), (m + 1.0 + rank) / 2.0)
    return np.where(pp > 1, np.where(vpp == 2, v_shape, looped), 1.0)


@dataclass(frozen=True)
class DeferredWeightGrads:
    """What zero-bubble ranks hold for weight-gradient steps W not yet run, beside the saved
    activations zero_bubble_held counts: torch's stage_backward_input captures the gradient
    entering every weight-gradient node (get_param_groups' intermediates; the prehook keeps
    param_group["grads"]) and keeps it until stage_backward_weight. Layer sets of the rank's
    blocks (rank 0, a middle rank, the last rank), micro-batches of the head's logit gradient on
    the rank with the loss, and ZB-V's cool-down state (below). Zeros elsewhere."""

    first: np.ndarray
    mid: np.ndarray
    last: np.ndarray
    head: np.ndarray
    """Micro-batches whose logit gradient the loss rank holds (its I done, its W not)."""
    v_cooldown: np.ndarray
    """ZB-V defers every W of its cool-down to the end: the last rank then holds c layer sets
    of saved activations and c of captured gradients together, c = min(pp, m - pp + 1) - 1/2
    (replayed; a middle rank holds less). 0 elsewhere."""


def deferred_weight_grads(schedule: np.ndarray, pp: np.ndarray, vpp: np.ndarray,
                          m: np.ndarray) -> DeferredWeightGrads:
    """Counts of DeferredWeightGrads, replayed from torch's schedules (torch 2.13): in
    ScheduleInterleavedZeroBubble rank k's peak comes after the I of its k-th steady step, with
    k + 1 chunks' I done and W not (min(k + 1, m * vpp) / vpp layer sets), and stage 0 runs no I
    (stage.py: "Skip the backward for the first stage", its W is a full backward), so rank 0
    holds none at vpp 1 and one chunk of a later stage otherwise; the last rank's k + 1 = pp
    chunks are all of its last stage (backward_stage_index starts at the last local stage for
    R steps), the one with the loss: min(pp, m) logit gradients. ZB-V's rank 0 holds one chunk,
    of the loss stage (its stage 0 runs no I), and so one logit gradient."""
    pp, vpp, m = (np.asarray(x, float) for x in (pp, vpp, m))
    zb = (np.asarray(schedule) == ZERO_BUBBLE) & (pp > 1)
    v = np.maximum(vpp, 1.0)
    chunks = m * v

    def looped(k: np.ndarray) -> np.ndarray:
        return np.minimum(k + 1.0, chunks) / v

    v_shape = vpp == 2
    first = np.where(v_shape, 0.5, np.where(vpp == 1, 0.0, looped(0.0 * pp)))
    mid = np.where(v_shape, 0.5, np.where(pp > 2, looped(pp - 2.0), first))
    last = np.where(v_shape, 0.5, looped(pp - 1.0))
    head = np.where(v_shape, 1.0, np.minimum(pp, m))
    cooldown = np.where(v_shape & (m > pp), np.minimum(pp, m - pp + 1.0) - 0.5, 0.0)
    return DeferredWeightGrads(*(np.where(zb, x, 0.0) for x in (first, mid, last, head,
                                                                  cooldown)))


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
