"""Megatron-LM's flags as the importer reads them: which it reads (a misspelling of one is
refused), which are torchrun's, and value readers that refuse what Megatron's parser refuses."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection

from autoplan.errors import ConfigError
from autoplan.export.megatron_moe import MLA_YARN_FLAGS, MOE_SWITCHES
from autoplan.export.megatron_neutral import NEUTRAL_SWITCHES, POSITIONS, neutral_flags
from autoplan.export.shell_args import Flags, expand_variables, parse_flags, unread_flags
from autoplan.yaml_io import show

SWITCHES = frozenset(
    {
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--optimizer-cpu-offload",
        "--use-precision-aware-optimizer",
        "--recompute-activations",
        "--bf16",
        "--fp16",
        "--grad-reduce-in-bf16",
        "--accumulate-allreduce-grads-in-fp32",
        "--group-query-attention",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--qk-layernorm",
        "--tp-comm-overlap",
        "--use-torch-fsdp2",
        "--use-megatron-fsdp",
        "--torch-fsdp2-no-reshard-after-forward",
        "--standalone",
        "--no-python",
        "--use-rotary-position-embeddings",
        "--use-rope-scaling",
        "--cpu-offloading",
        "--distribute-saved-activations",
    }
) | MOE_SWITCHES | NEUTRAL_SWITCHES
"""store_true flags we read or may meet beside them (torchrun's); they take no value."""
_TORCHRUN = ("nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port",
             "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "standalone",
             "max-restarts", "monitor-interval", "start-method", "role", "module", "no-python",
             "run-path", "log-dir", "redirects", "tee", "local-ranks-filter", "local-addr")
LAUNCHER_FLAGS = frozenset(f"--{name}" for name in _TORCHRUN) | frozenset(
    f"--{name.replace('-', '_')}" for name in _TORCHRUN)
"""torchrun's flags (torch/distributed/run.py), which it takes with dashes or underscores and
abbreviated (argparse's allow_abbrev): neither refused as a misspelling nor said skipped."""
READ_FLAGS = (SWITCHES - LAUNCHER_FLAGS - NEUTRAL_SWITCHES) | frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
    "--num-query-groups", "--seq-length", POSITIONS, "--vocab-size", "--tokenizer-type",
    "--make-vocab-size-divisible-by", "--normalization", "--norm-epsilon",
    "--position-embedding-type",
    "--rotary-base", "--rope-scaling-factor",
    "--attention-dropout", "--hidden-dropout", "--micro-batch-size", "--global-batch-size",
    "--optimizer", "--optimizer-offload-fraction", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--recompute-modules", "--cp-comm-type", "--fp8-format",
    "--attention-backend", "--transformer-impl", "--data-parallel-sharding-strategy",
    "--num-distributed-optimizer-instances", "--pipeline-model-parallel-layout",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    # megatron_moe.moe_fields and expert_degrees
    "--num-experts", "--moe-ffn-hidden-size", "--moe-router-topk", "--moe-layer-freq",
    "--moe-shared-expert-intermediate-size", "--moe-router-dtype", "--moe-expert-capacity-factor",
    "--moe-router-score-function", "--moe-router-bias-update-rate", "--moe-router-num-groups",
    "--moe-router-group-topk", "--moe-router-topk-scaling-factor", "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--mtp-num-layers", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", *MLA_YARN_FLAGS,
})
"""Megatron-LM flags the importer reads: an unknown flag that misspells one of them is refused
(shell_args.unread_flags), where reading on would take that flag's default."""
UNREAD_NEIGHBOURS = frozenset({"--fp4-format", "--tp-comm-overlap-ag", "--tp-comm-overlap-rs"})
"""Megatron flags a misspelling away from one we read (--fp8-format, --tp-comm-overlap), never
refused (megatron/training/arguments.py; checked against Megatron-Core's config fields in the
tests)."""


def choice(f: Flags, flag: str, choices: Collection[str], default: str | None) -> str | None:
    """A flag's value, refused unless it is one of Megatron's `choices`."""
    value = f.text(flag, default)
    if value is not None and value not in choices:
        raise ConfigError(f"{f.what} {flag}", f"got {show(value)}",
                          f"expected one of {', '.join(choices)}")
    return value


def positive(f: Flags, flag: str, default: int = 1) -> int:
    """A count flag (a parallel degree, a layer count, a divisor): a positive integer,
    `default` when absent."""
    value = f.integer(flag, default)
    if value is None or value < 1:
        raise ConfigError(f"{f.what} {flag}", f"got {value}", "expected a positive integer")
    return value


def flag_values(text: str, name: str) -> list[str] | None:
    """The values of a list flag (argparse nargs='*', e.g. --recompute-modules core_attn mlp):
    the words after its last occurrence up to the next flag; None when it is absent."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    tokens, found = list(lexer), None
    for i, tok in enumerate(tokens):
        if tok == name or tok.startswith(name + "="):
            rest = [tok.partition("=")[2]] if "=" in tok else []
            for word in tokens[i + 1:] if "=" not in tok else []:
                if word.startswith("--"):
                    break
                rest.append(word)
            found = rest
    return found


def megatron_flags(text: str, what: str) -> Flags:
    """The launch's flags as the importer reads them (variables expanded, switches known)."""
    return Flags(parse_flags(expand_variables(text), SWITCHES), what)


def unread_megatron_flags(text: str, what: str) -> list[str]:
    """The Megatron flags in `text` the importer skips (data, logging, ...); torchrun's are
    not Megatron's to say."""
    f = megatron_flags(text, what)
    unread = unread_flags(f, READ_FLAGS | neutral_flags(f), LAUNCHER_FLAGS | UNREAD_NEIGHBOURS,
                          "Megatron")
    return [name for name in unread if name not in LAUNCHER_FLAGS]


CORE_FLAGS = ("--num-layers", "--hidden-size", "--num-attention-heads",
              "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
              "--micro-batch-size", "--global-batch-size", "--seq-length")
"""The flags every pretrain_gpt.py launch gives, named where a file holds none it reads."""


def check_megatron_arguments(text: str, path: str) -> None:
    """Refuse a file holding none of the Megatron-LM flags the importer reads (READ_FLAGS,
    torchrun's aside): another tool's script (an sbatch of `autoplan train`, say), which read
    on would be refused for something it never said (its "missing" RoPE scaling beside
    --model), not for being no Megatron launch."""
    flags = megatron_flags(text, f"megatron arguments {path}").flags
    if any(name in READ_FLAGS and name not in LAUNCHER_FLAGS for name in flags):
        return
    found = [name for name in flags if name not in LAUNCHER_FLAGS][:6]
    has = f"; its flags ({' '.join(found)}) are none of them" if found else ""
    fix = "give the pretrain_gpt.py launch script, or a file of its arguments"
    trained = re.search(r"(?:^|\s)autoplan\s+train\s+(\S+)", text)
    if trained:  # an exported autoplan job: the plan it trains is the plan
        from autoplan.export.kubernetes import PLAN_ENV, PLAN_FILE

        plan = trained.group(1).strip("'\"")
        if plan == PLAN_FILE:  # a pod's path: the manifest carries the plan in an env var
            fix += (f" (this Kubernetes manifest runs `autoplan train` on the plan it carries "
                    f"in {PLAN_ENV}: that plan needs no import; save it to a file and "
                    "`autoplan estimate --plan FILE` prices it)")
        else:
            fix += (f" (this file runs `autoplan train {plan}`: that plan needs no import; "
                    f"`autoplan estimate --plan {plan}` prices it)")
    raise ConfigError(f"FILE {path}", "no Megatron-LM arguments found: it holds none of those "
                      f"the import reads ({', '.join(CORE_FLAGS)}, ...){has}", fix)
