"""The rules of what autoplan's own runtime cannot run (`autoplan train`), apart from the
planner's: search and export still consider these plans. plan_rules.runtime_limits applies
them to one plan, cost.runtime_rules to a table."""

from __future__ import annotations

import numpy as np

from autoplan.model_spec import ModelSpec
from autoplan.plan import RecomputeModule
from autoplan.plan_rules_base import Rule, row_int
from autoplan.plan_table import Table, col, dp_col, expert_col, fp8_col, modules_mask

_LAYERNORM_BIT = modules_mask((RecomputeModule.LAYERNORM,))


def _moe_tokens_split_over_tp(t: Table, m: ModelSpec) -> np.ndarray:
    """Tokens of one micro-batch on one rank (mbs * seq_len / cp) split evenly over tp."""
    return (col(t, "mbs") * (m.seq_len // col(t, "cp"))) % col(t, "tp") == 0


def _expert_ranks(t: Table) -> np.ndarray:
    """ep * etp: the ranks one layer's routed experts are spread over."""
    return expert_col(t, "ep") * expert_col(t, "etp")


RUNTIME_RULES: tuple[Rule, ...] = (
    Rule(
        "runtime-layernorm-recompute-tp",
        lambda t, m: ((dp_col(t, "rc_modules") & _LAYERNORM_BIT) > 0) & (col(t, "tp") > 1),
        lambda t, i, m: f"recompute.modules layernorm with tp={row_int(t, 'tp', i)}: autoplan's "
        "runtime discards norm outputs only where the GEMMs save them as plain tensors (tp 1; "
        "under tensor parallelism they are DTensors); drop layernorm, or export to Megatron-LM",
    ),
    Rule(
        "runtime-moe-capacity",
        lambda t, m: np.bool_(m.moe is not None and m.moe.capacity_factor is not None)
        & (col(t, "cp") > 1),
        lambda t, i, m: f"model.moe.capacity_factor={m.moe.capacity_factor if m.moe else None} "
        f"with parallel.cp={row_int(t, 'cp', i)}: autoplan's runtime drops tokens per whole "
        "sequence, which context parallelism splits; set capacity_factor: null or cp: 1",
    ),
    Rule(
        "runtime-moe-groups-softmax",
        lambda t, m: np.bool_(m.moe is not None and m.moe.route_groups > 1
                              and not m.moe.router_aux_free),
        lambda t, i, m: f"model.moe.route_groups={m.moe.route_groups if m.moe else None} with "
        "router_aux_free=false: autoplan's runtime limits routing to groups with DeepSeek-V3's "
        "sigmoid router only; set router_aux_free: true or route_groups: 1",
    ),
    Rule(
        "runtime-fp8-tp",
        lambda t, m: fp8_col(t) & (col(t, "tp") > 1),
        lambda t, i, m: f"precision fp8 with tp={row_int(t, 'tp', i)}: autoplan's runtime trains "
        "fp8 through torchao's float8 layers without their tensor-parallel styles "
        "(runtime/float8.py); use tp 1 or bf16, or export to Megatron-LM or torchtitan",
    ),
    Rule(
        "runtime-mtp",
        lambda t, m: np.bool_(m.mtp_layers > 0),
        lambda t, i, m: f"model.mtp_layers={m.mtp_layers}: autoplan's runtime has no "
        "multi-token-prediction module (DeepSeek-V3 report §2.2); set mtp_layers: 0 to train "
        "the main model alone, or export to Megatron-LM (--mtp-num-layers)",
    ),
    Rule(
        "runtime-hsdp-ep",
        lambda t, m: (dp_col(t, "dp_shard") > 0) & (_expert_ranks(t) > 1),
        lambda t, i, m: f"parallel.dp_shard={int(dp_col(t, 'dp_shard')[i])} with ep="
        f"{int(expert_col(t, 'ep')[i])}, etp={int(expert_col(t, 'etp')[i])}: autoplan's runtime "
        "shards MoE experts over their own expert-DP mesh without HSDP; set dp_shard: null",
    ),
    Rule(
        "runtime-ep-tp-tokens",
        lambda t, m: (_expert_ranks(t) > 1) & (col(t, "tp") > 1)
        & ~_moe_tokens_split_over_tp(t, m),
        lambda t, i, m: f"parallel.ep={int(expert_col(t, 'ep')[i])}, etp="
        f"{int(expert_col(t, 'etp')[i])} with tp={row_int(t, 'tp', i)}: "
        f"each tp rank sends 1/tp of a micro-batch's {row_int(t, 'mbs', i)} * "
        f"{m.seq_len // row_int(t, 'cp', i)} tokens to the experts; choose a micro_batch_size "
        "that makes them divisible by tp",
    ),
)
"""What autoplan's own runtime cannot run (autoplan train), apart from the planner's rules:
search and export still consider these plans (Megatron-LM runs them)."""
RUNTIME_RULE_KEYS: tuple[str, ...] = tuple(r.key for r in RUNTIME_RULES)
