"""What the launch headers tell a user before they run the script: the torchrun and SLURM
headers, that a stop by a signal prints torchrun's own SignalException traceback (expected) and
that a job started again once its run is done exits 0 training nothing; the Megatron-LM and
Megatron-DeepSpeed headers, that the launch needs --train-iters or --train-samples (user test 38
N4, N7, S2)."""

from __future__ import annotations

import pytest

from autoplan.export.base import ExportOptions, export_plan
from autoplan.export.launch import LaunchOptions
from autoplan.export.registry import get_target
from autoplan.export.slurm import SlurmOptions

from .cases import CASES, plan


def _header(target: str, plan_, opts: ExportOptions, name: str | None = None) -> str:
    """The script's '# ' comment lines, joined into one text (the wrapping left out)."""
    files = export_plan(get_target(target), plan_, plan_.model_spec(), opts)
    text = files[name] if name else next(iter(files.values()))
    return " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))


TRACEBACK = ("prints torchrun's own traceback{where} (torch.distributed.elastic.multiprocessing."
             "api.SignalException: Process N got signal: 15) before the script's line: torchrun's "
             "exit after passing the signal on, expected, and no error of the run.")
DONE = ("Started again once all 300 steps are trained (resubmitted, requeued, chained), the "
        "ranks train nothing: one line says so and the script exits 0.")


@pytest.mark.parametrize(("target", "options", "where", "requeue"), [
    ("torchrun", LaunchOptions, "", False),
    ("slurm", SlurmOptions, " in the job log", False),
    ("slurm", SlurmOptions, " in the job log", True),
])
def test_launch_headers_expect_torchruns_traceback_and_a_run_done(target, options, where,
                                                                  requeue):
    opts = options(gpus_per_node=8, steps=300, **({"requeue": True} if requeue else {}))
    header = _header(target, plan(gpus=8), opts)
    assert TRACEBACK.format(where=where) in header
    assert DONE in header


def test_an_elastic_slurm_header_promises_the_line_for_a_run_done():
    """Under --elastic every rank finds the checkpoint at --steps before it re-plans, and rank 0
    says the non-elastic path's line (tests/dist/test_elastic_done.py runs it)."""
    header = _header("slurm", CASES["dp-zero1"][0],
                     SlurmOptions(gpus_per_node=8, steps=300, elastic=True))
    assert TRACEBACK.format(where=" in the job log") in header
    assert DONE in header


LENGTH = ("{tool} needs the run's length, --train-iters N (optimizer steps, each of global batch "
          "64 x seq_len 2048 = 131,072 tokens) or --train-samples N (sequences): with neither it "
          "fails at start (update_train_iters divides the missing --train-samples by the global "
          "batch). This export takes no --steps: `autoplan train --steps N` is --train-iters N.")


def test_the_megatron_header_names_the_run_length_flags():
    header = _header("megatron", plan(gpus=8), ExportOptions(gpus_per_node=8))
    assert LENGTH.format(tool="Megatron-LM") in header
    assert "Append it, data and optimizer flags as arguments to this script" in header
    assert "bash megatron_args.sh --train-iters N --data-path ..." in header


def test_the_megatron_deepspeed_header_names_the_run_length_flags():
    three_d = CASES["fp16-pipeline-ds"][0]
    assert three_d.batch.global_batch_size == 64 and three_d.model_spec().seq_len == 2048
    header = _header("deepspeed", three_d, ExportOptions(gpus_per_node=8), "launch.sh")
    assert LENGTH.format(tool="Megatron-DeepSpeed") in header
    assert "Append it, data, tokenizer and optimizer flags as arguments" in header
