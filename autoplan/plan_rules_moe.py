"""The rules of a MoE plan's expert grid: ep and etp need experts, divide the experts and their
FFN width, and fold into the ranks of one pipeline stage (or one HSDP shard group); plan_rules
applies them after plan_rules_layout's."""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import ModelSpec
from autoplan.plan_rules_base import Rule, divisors
from autoplan.plan_table import Table, col, dp_col, expert_col

_NEVER = np.zeros(1, dtype=bool)
"""A rule that cannot apply to this model (broadcast to every row)."""


def _experts(m: ModelSpec) -> int:
    return 0 if m.moe is None else m.moe.num_experts


def _expert_group(t: Table) -> np.ndarray:
    """dp x cp x tp: the ranks of one pipeline stage, which Megatron-Core folds into
    etp x ep x expert-dp (parallel_state.initialize_model_parallel, "MoE parallel folding")."""
    return col(t, "dp") * col(t, "cp") * col(t, "tp")


def _hsdp_expert_group(t: Table) -> np.ndarray:
    """dp_shard x cp x tp: one HSDP shard group's ranks of a stage, where its experts fold."""
    return np.maximum(dp_col(t, "dp_shard"), 1) * col(t, "cp") * col(t, "tp")


MOE_RULES: tuple[Rule, ...] = (
    Rule(
        "ep-needs-moe",
        lambda t, m: _NEVER if m.moe is not None
        else (expert_col(t, "ep") > 1) | (expert_col(t, "etp") > 1),
        lambda t, i, m: f"parallel.ep={int(expert_col(t, 'ep')[i])}, etp="
        f"{int(expert_col(t, 'etp')[i])}: model {m.name} has no experts; set ep: 1 and etp: 1",
    ),
    Rule(
        "ep-divides-experts",
        lambda t, m: _NEVER if m.moe is None else _experts(m) % expert_col(t, "ep") != 0,
        lambda t, i, m: f"parallel.ep={int(expert_col(t, 'ep')[i])} does not divide "
        f"moe.num_experts={_experts(m)}; choose ep from {divisors(max(_experts(m), 1))}",
    ),
    Rule(
        "etp-divides-expert-ffn",
        lambda t, m: _NEVER if m.moe is None
        else m.moe.expert_ffn_hidden_size % expert_col(t, "etp") != 0,
        lambda t, i, m: f"parallel.etp={int(expert_col(t, 'etp')[i])} does not divide "
        f"moe.expert_ffn_hidden_size={m.moe.expert_ffn_hidden_size if m.moe else 0}; "
        "choose an etp that divides it",
    ),
    Rule(
        "ep-etp-divides-dp-cp-tp",
        lambda t, m: _NEVER if m.moe is None  # ep-needs-moe refuses ep > 1 there
        else _expert_group(t) % (expert_col(t, "ep") * expert_col(t, "etp")) != 0,
        lambda t, i, m: f"parallel.ep * etp = "
        f"{int(expert_col(t, 'ep')[i] * expert_col(t, 'etp')[i])} does not divide dp * cp * tp "
        f"= {int(_expert_group(t)[i])} (Megatron-Core folds the expert grid into it); choose "
        f"ep * etp from {divisors(int(_expert_group(t)[i]))}",
    ),
    Rule(
        "ep-etp-divides-hsdp-shard",
        lambda t, m: _NEVER if m.moe is None
        else (dp_col(t, "dp_shard") > 0)
        & (_hsdp_expert_group(t) % (expert_col(t, "ep") * expert_col(t, "etp")) != 0),
        lambda t, i, m: f"parallel.ep * etp = "
        f"{int(expert_col(t, 'ep')[i] * expert_col(t, 'etp')[i])} does not divide dp_shard * "
        f"cp * tp = {int(_hsdp_expert_group(t)[i])}: under HSDP the experts fold into one shard "
        "group, each replica holding them whole; choose ep * etp from "
        f"{divisors(int(_hsdp_expert_group(t)[i]))} or dp_shard: null",
    ),
)
