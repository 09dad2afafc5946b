"""The dropout a run applies is the one its checks and predictions price: the model's own
(model.dropout) unless `train --dropout` sets another; and the cost model keeps no attention
dropout for a runtime that drops only the residual branches (autoplan's)."""

from __future__ import annotations

import argparse

import numpy as np

from autoplan.cost.activations import activation_elements_per_layer
from autoplan.cost.estimate import estimate_plan
from autoplan.cost.runtimes import load_runtime
from autoplan.model_spec import PRESETS
from autoplan.plan import plan_from_dict
from autoplan.runtime.launch import run_dropout

GPT = {"model": "gpt3-125m", "cluster": {"profile": "cpu-gloo", "num_gpus": 1},
       "batch": {"micro_batch_size": 1, "global_batch_size": 1}, "precision": "fp32",
       "attention": "eager"}


def test_the_run_takes_the_models_dropout_unless_told_otherwise() -> None:
    plan = plan_from_dict(GPT)
    assert plan.model_spec().dropout == 0.1  # the GPT-3 presets' rate
    args = argparse.Namespace(dropout=None)
    assert run_dropout(args, plan) is plan and args.dropout == 0.1
    args = argparse.Namespace(dropout=0.0)
    changed = run_dropout(args, plan)
    assert changed.model_spec().dropout == 0.0 and args.dropout == 0.0
    # priced as it runs: no residual dropout masks kept
    assert estimate_plan(changed).memory["total"] < estimate_plan(plan).memory["total"]


def test_attention_dropout_is_priced_only_where_the_runtime_applies_it() -> None:
    spec = PRESETS["gpt3-125m"]
    one = np.array(1.0)

    def core(runtime: str) -> float:
        rt = load_runtime(runtime)
        parts = activation_elements_per_layer(spec, one, one, np.array(False), one, True,
                                              attention_dropout=rt.attention_dropout)
        return float(parts["core"])

    a, s = spec.num_heads, spec.seq_len
    assert core("megatron") == 5.0 * a * s * s  # softmax, mask, dropped output
    assert core("autoplan-cuda") == core("autoplan-cpu") == 2.0 * a * s * s  # softmax only
