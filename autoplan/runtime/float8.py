"""FP8 training through torchao's float8 linear layers (CUDA only).

torchao's `convert_to_float8_training` swaps each nn.Linear for a Float8Linear that casts its
input, weight and output gradient to fp8 with dynamic per-tensor scaling and runs the GEMMs in
fp8 (torchao/float8/README.md; torchtitan's float8 converter does the same). The output layer
stays 16-bit, as the cost model prices it (autoplan.cost.block_time.sixteen_bit_peak). Where CUDA,
a GPU with fp8 tensor cores or torchao is missing, the runtime refuses the plan in one line.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from autoplan.plan import Plan, Precision


def fp8_problem(plan: Plan) -> str | None:
    """Why this machine cannot train `plan` in fp8 (None when it can, or the plan is not fp8)."""
    if plan.precision != Precision.FP8:
        return None
    if not torch.cuda.is_available():
        return ("precision fp8 needs a CUDA GPU with fp8 tensor cores (H100/H200); this machine "
                "has none: use bf16 here, or export the plan to megatron or torchtitan")
    if torch.cuda.get_device_capability() < (8, 9):
        return (f"precision fp8 needs compute capability 8.9+ (Ada/Hopper), this GPU has "
                f"{torch.cuda.get_device_capability()}: use bf16")
    if importlib.util.find_spec("torchao") is None:
        return "precision fp8 trains through torchao's float8 layers: pip install torchao"
    return None  # fp8 with tp > 1: plan_rules' runtime-fp8-tp, one rule for train and search


def apply_float8(model: nn.Module) -> None:
    """Swap the blocks' Linear layers for torchao Float8Linear, in place (not the head)."""
    from torchao.float8 import convert_to_float8_training

    def keep_fp8(module: nn.Module, fqn: str) -> bool:
        # fp8 GEMMs need dimensions divisible by 16 (torchao/float8 README)
        return (fqn.startswith("layers.") and isinstance(module, nn.Linear)
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    convert_to_float8_training(model, module_filter_fn=keep_fp8)
