"""The runtime preset an imported Megatron launch is priced with (its last line, `price it as
megatron runs it: autoplan estimate --plan ... --runtime X`): --tp-comm-overlap (Transformer
Engine's userbuffers) picks `nemo`, the preset that prices it; the MoE dispatcher picks its own;
a launch Megatron would not start (the overlap without sequence parallelism) is refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from autoplan.commands import main
from autoplan.export.importers import import_megatron, launch_runtime
from autoplan.export.megatron_args import unread_megatron_flags
from tests.cli_refusals import assert_refused

CLUSTER = "h100-sxm-80gb"
GPT = ("torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 8 "
       "--sequence-parallel --num-layers 24 --hidden-size 2048 --num-attention-heads 16 "
       "--seq-length 2048 --max-position-embeddings 2048 --vocab-size 50257 "
       "--micro-batch-size 1 --global-batch-size 64 --bf16 ")
"""gpt3-1.3b at tp 8 with sequence parallelism on 16 GPUs."""
MOE = ("--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 "
       "--moe-token-dispatcher-type flex --moe-enable-deepep --swiglu "
       "--ffn-hidden-size 5632 ")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "launch.sh"
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize(("flags", "runtime", "note"), [
    ("", "megatron", None),
    ("--tp-comm-overlap", "nemo", None),  # the user test's: it suggested megatron
    (MOE, "megatron-deepep", None),  # its dispatcher's (the last line said megatron)
    (MOE + "--tp-comm-overlap", "nemo",
     "no runtime preset prices both its --tp-comm-overlap (nemo) and its MoE dispatcher "
     "(megatron-deepep)"),
])
def test_the_launch_picks_the_preset_that_prices_it(tmp_path, flags, runtime, note) -> None:
    path = _write(tmp_path, GPT + flags)
    assert launch_runtime("megatron", path) == (runtime, note)
    assert "--tp-comm-overlap" not in unread_megatron_flags(path.read_text(), "x")  # read


def test_the_import_says_so_and_its_last_line_names_nemo(tmp_path, caplog, capsys) -> None:
    path = _write(tmp_path, GPT + "--tp-comm-overlap")
    with caplog.at_level(logging.WARNING):
        import_megatron(path, model=None, cluster=CLUSTER, num_gpus=None)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "--tp-comm-overlap overlaps tensor-parallel communication with GEMMs" in said
    assert "estimate the plan with --runtime nemo" in said and "skipped" not in said
    out = tmp_path / "plan.yaml"
    assert main(["import", str(path), "--from", "megatron", "--cluster", CLUSTER,
                 "--out", str(out)]) == 0
    assert (f"price it as megatron runs it: autoplan estimate --plan {out} --runtime nemo\n"
            in capsys.readouterr().err)
    assert main(["estimate", "--plan", str(out), "--runtime", "nemo", "--format", "json"]) == 0


@pytest.mark.parametrize(("text", "said"), [
    (GPT.replace("--sequence-parallel ", "") + "--tp-comm-overlap",
     "--tp-comm-overlap: without --sequence-parallel; Megatron asserts sequence parallelism"),
    (GPT.replace("--tensor-model-parallel-size 8", "--tensor-model-parallel-size 1")
     + "--tp-comm-overlap",
     "--tp-comm-overlap: at tp=1, where Megatron turns sequence parallelism off"),
])
def test_an_overlap_megatron_would_not_start_is_refused(tmp_path, capsys, text, said) -> None:
    path = _write(tmp_path, text)
    assert_refused(capsys, ["import", str(path), "--from", "megatron", "--cluster", CLUSTER],
                   said)
