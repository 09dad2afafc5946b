"""The runtime-traits preset that prices an imported Megatron-LM launch as it runs, which a plan
cannot carry: its MoE token dispatcher (megatron_moe.dispatcher_runtime) and Transformer Engine's
comm-GEMM overlap of tensor parallelism (--tp-comm-overlap, userbuffers), which the `nemo` preset
prices; `megatron` prices the async input-gradient overlap Megatron-Core runs without it
(cost/runtime_traits.py tp_comm_overlap_method). `import` names the preset on its last line.
"""

from __future__ import annotations

import logging

from autoplan.errors import ConfigError
from autoplan.export.megatron_moe import dispatcher_runtime
from autoplan.export.shell_args import Flags

log = logging.getLogger(__name__)

TP_OVERLAP = "--tp-comm-overlap"
TP_OVERLAP_RUNTIME = "nemo"
"""The preset whose traits price userbuffers (tp_comm_overlap_method), NeMo's recipes' setting."""


def check_tp_overlap(f: Flags, tp: int, sequence_parallel: bool) -> None:
    """--tp-comm-overlap as Megatron takes it: validate_args turns sequence parallelism off at
    tp=1, then asserts it under the flag ("Tensor parallel communication/GEMM overlap can happen
    only when sequence parallelism is enabled"), so a launch without both refuses to start."""
    if f.has(TP_OVERLAP) and not (tp > 1 and sequence_parallel):
        why = "at tp=1, where Megatron turns sequence parallelism off" if tp == 1 else \
            "without --sequence-parallel"
        raise ConfigError(f"{f.what} {TP_OVERLAP}", why, "Megatron asserts sequence "
                          "parallelism with it and would not start: add --sequence-parallel "
                          "(with tp > 1), or drop the flag")


def launch_runtime(f: Flags) -> tuple[str, str | None]:
    """(the preset `estimate --runtime` prices the launch with, a sentence where no one preset
    prices all it does, else None)."""
    dispatch = dispatcher_runtime(f)
    if not f.has(TP_OVERLAP):
        if dispatch is None:
            return "megatron", ("no runtime preset prices the flex dispatcher without DeepEP: "
                                "megatron prices alltoall, megatron-deepep DeepEP")
        return dispatch, None
    if dispatch == "megatron":
        return TP_OVERLAP_RUNTIME, None
    return TP_OVERLAP_RUNTIME, (f"no runtime preset prices both its {TP_OVERLAP} (nemo) and "
                                f"its MoE dispatcher ({dispatch or 'flex without DeepEP'})")


def say_runtime(f: Flags) -> None:
    """What the launch's --tp-comm-overlap means for its price (the dispatcher's is said by
    megatron_moe): read, not skipped."""
    if f.has(TP_OVERLAP):
        runtime, note = launch_runtime(f)
        log.warning("%s: %s overlaps tensor-parallel communication with GEMMs (Transformer "
                    "Engine userbuffers): estimate the plan with --runtime %s (the megatron "
                    "runtime prices the overlap Megatron-Core runs without it)%s", f.what,
                    TP_OVERLAP, runtime, f"; {note}" if note else "")
