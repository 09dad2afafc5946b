"""The embedding's dense gradient per micro-batch (stage_time.embedding_grad_s)."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost import compute, stage_time
from autoplan.cost.estimate import estimate_table
from autoplan.cost.rows import rows_of
from autoplan.cost.runtimes import load_runtime
from autoplan.hardware import load_profile
from autoplan.model_spec import load_model
from autoplan.plan import Batch, ClusterRef, Parallel, Plan, Precision
from autoplan.plan_table import plan_to_row

MODEL = load_model("llama-3.1-8b")
H100 = load_profile("h100-sxm-80gb")


def _plan(tp: int = 1) -> Plan:
    return Plan(model="llama-3.1-8b", cluster=ClusterRef("h100-sxm-80gb", 8),
                batch=Batch(1, 32), parallel=Parallel(dp=8 // tp, tp=tp), zero_stage=1,
                precision=Precision.BF16)


def test_zero_fill_and_megatrons_add_into_main_grad_are_the_bytes_moved() -> None:
    """torch zero-fills the rank's vocab/tp x h bf16 gradient (2 bytes each); Megatron then
    reads it (2) and adds it into its fp32 main_grad (read 4, write 4): 12 bytes an element."""
    megatron = load_runtime("megatron")
    for tp in (1, 2):
        row = plan_to_row(_plan(tp), MODEL)
        r = rows_of(row, MODEL, "bf16", megatron)
        elements = float(r.vocab[0]) / tp * MODEL.hidden_size
        assert stage_time.embedding_grad_s(MODEL, H100, megatron, r)[0] == pytest.approx(
            float(compute.memory_time_s(12.0 * elements, H100)))
        plain = dataclasses.replace(megatron, adds_into_grad_buffer=False)
        assert stage_time.embedding_grad_s(MODEL, H100, plain, r)[0] == pytest.approx(
            float(compute.memory_time_s(2.0 * elements, H100)))


def test_the_first_stage_pays_it_every_micro_batch() -> None:
    """Without a pipeline the one stage holds the embedding: the step's compute grows by the
    per-micro-batch cost times the micro-batches (4 here)."""
    megatron = load_runtime("megatron")
    plain = dataclasses.replace(megatron, adds_into_grad_buffer=False)
    row = plan_to_row(_plan(), MODEL)
    r = rows_of(row, MODEL, "bf16", megatron)
    extra = 4 * (stage_time.embedding_grad_s(MODEL, H100, megatron, r)[0]
                 - stage_time.embedding_grad_s(MODEL, H100, plain, r)[0])
    got = [estimate_table(row, MODEL, H100, "bf16", "flash", t)["time_compute"][0]
           for t in (megatron, plain)]
    assert got[0] - got[1] == pytest.approx(extra)
