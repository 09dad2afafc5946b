"""A trainer's metric passes over the logits (RuntimeTraits.train_metric_passes): Composer's
two train metrics, each a torch cross-entropy under autocast, priced in time at their bytes per
logit and nothing else; the field is checked on load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoplan.cost.estimate import estimate_plan
from autoplan.cost.params import padded_vocab
from autoplan.cost.runtime_kinds import LOSS_CAST_BYTES, METRIC_PASS_BYTES
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
    # upcast (read 2, write 4) and an fp32 log_softmax (read 4, write 4) per pass
    assert METRIC_PASS_BYTES == 2 + 4 + 4 + 4
    assert foundry.loss_bytes("bf16") == 8.0 + 2 * METRIC_PASS_BYTES
    # an fp32 run has no upcast: the fused kernel's own bytes double, the passes lose theirs
    assert foundry.loss_bytes("fp32") == 16.0 + 2 * (METRIC_PASS_BYTES - LOSS_CAST_BYTES / 2)
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
    # memory is not priced for them (their fp32 transients come after backward's peak)
    assert with_metrics.memory_total_bytes == without.memory_total_bytes


@pytest.mark.parametrize("bad", [-1, 9, 1.5, True, "two"])
def test_a_traits_file_with_a_bad_pass_count_is_refused_in_one_line(bad) -> None:
    with pytest.raises(ConfigError, match="train_metric_passes") as err:
        runtime_from_dict({"schema_version": 1, "base": "torchtitan",
                           "train_metric_passes": bad})
    assert "\n" not in str(err.value)
