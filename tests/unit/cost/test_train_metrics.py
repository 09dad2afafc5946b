"""A trainer's metric passes over the logits (RuntimeTraits.train_metric_passes): Composer's
two train metrics, each a torch cross-entropy under autocast, priced in time at their bytes per
logit, and in memory where their fp32 copies after backward outgrow backward's own peak; the
field is checked on load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.params import padded_vocab
from autoplan.cost.runtime_kinds import METRIC_PASS_BYTES, METRIC_PASS_LIVE_BYTES
from autoplan.cost.runtimes import load_runtime, runtime_from_dict
from autoplan.errors import ConfigError
from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.plan import plan_from_dict

# one GPU, no data parallelism: the step is its micro-batches' work and the optimizer, so a
# change to the loss stage's memory-bound bytes shows up whole
ONE_GPU = {"model": "gpt3-125m", "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 1},
           "parallel": {"dp": 1}, "zero_stage": 0, "precision": "bf16",
           "batch": {"micro_batch_size": 8, "global_batch_size": 32}}


def test_composer_runs_two_cross_entropies_beside_its_fused_loss() -> None:
    foundry = load_runtime("llm-foundry")
    assert foundry.train_metric_passes == 2
    # flash_attn's fused loss 8, and two passes of upcast (read 2, write 4) and fp32
    # log_softmax (read 4, write 4)
    assert foundry.loss_bytes("bf16") == 8.0 + 2 * 14.0
    # an fp32 run has no upcast: the fused kernel's own bytes double, the passes lose theirs
    assert foundry.loss_bytes("fp32") == 16.0 + 2 * 8.0
    # alive during a pass: the kept 16-bit logits, the fp32 upcast and log_softmax's output
    assert foundry.metric_live_bytes("bf16") == 2 + 4 + 4
    assert foundry.metric_live_bytes("fp32") == 4 + 4
    for name in ("megatron", "torchtitan", "deepspeed", "nanotron", "autoplan"):
        assert load_runtime(name).train_metric_passes == 0, name


def test_the_passes_cost_their_bytes_at_hbm_speed_once_per_micro_batch() -> None:
    plan = plan_from_dict(ONE_GPU)
    foundry = load_runtime("llm-foundry")
    with_metrics = estimate_plan(plan, runtime=foundry)
    without = estimate_plan(plan, runtime=replace(foundry, train_metric_passes=0))
    profile, model = load_profile("a100-sxm4-80gb"), load_model("gpt3-125m")
    logits = 8 * model.seq_len * float(padded_vocab(model))  # a micro-batch's, tp 1
    per_micro_batch = 2 * METRIC_PASS_BYTES * logits / (
        profile.device.hbm_bytes_per_s * profile.efficiency.memory_bound)
    assert with_metrics.step_time_s - without.step_time_s == pytest.approx(
        4 * per_micro_batch, rel=1e-9)
    # this plan's backward outgrows a pass's copies: memory as without them
    assert with_metrics.memory_total_bytes == without.memory_total_bytes


def test_after_backward_the_passes_copies_set_the_peak_of_a_small_model() -> None:
    # 125M with whole-block checkpointing and 32 sequences a micro-batch: once backward has
    # freed the micro-batch's activations its logits are upcast for each metric pass, 10 bytes
    # per logit alive, twice what backward kept at its peak (no pipeline: nothing else in flight)
    plan = plan_from_dict({**ONE_GPU, "cluster": {"profile": "a100-sxm4-80gb", "num_gpus": 8},
                           "parallel": {"dp": 8}, "zero_stage": 3,
                           "recompute": {"policy": "full"},
                           "batch": {"micro_batch_size": 32, "global_batch_size": 512}})
    foundry = load_runtime("llm-foundry")
    with_metrics = estimate_plan(plan, runtime=foundry)
    without = estimate_plan(plan, runtime=replace(foundry, train_metric_passes=0))
    model = load_model("gpt3-125m")
    logits = 32 * model.seq_len * float(padded_vocab(model))
    assert with_metrics.memory["activations"] == pytest.approx(
        METRIC_PASS_LIVE_BYTES * logits, rel=1e-9)
    assert without.memory["activations"] < 0.5 * with_metrics.memory["activations"]
    assert with_metrics.step_time_s > without.step_time_s  # and they cost time


@pytest.mark.parametrize("bad", [-1, 9, 1.5, True, "two"])
def test_a_traits_file_with_a_bad_pass_count_is_refused_in_one_line(bad) -> None:
    with pytest.raises(ConfigError, match="train_metric_passes") as err:
        runtime_from_dict({"schema_version": 1, "base": "torchtitan",
                           "train_metric_passes": bad})
    assert "\n" not in str(err.value)
