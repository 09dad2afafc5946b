"""The real consumers the export tests check against, or their documented stand-ins.

`run_script` executes an exported shell script under bash with the launchers stubbed out, so a
test sees the exact argv that torchrun/srun/deepspeed would receive; torchrun's own argument
parser then reads it; Megatron's flags are parsed by a parser rebuilt from its definitions.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import types
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parents[2] / "data" / "export"


def run_script(path: Path, stubs: dict[str, str], *args: str,
               cwd: Path | None = None) -> list[list[str]]:
    """Run `path` under bash with each stub command replaced by a recorder on PATH, from `cwd`
    (default: the script's folder).

    `stubs` maps a command name to the line it prints (e.g. a host name for `scontrol`);
    recorded calls come back as [name, *argv] lists, one per call.
    """
    bin_dir = path.parent / "stub-bin"
    bin_dir.mkdir(exist_ok=True)
    log = path.parent / "stub-calls"
    for name, output in stubs.items():
        stub = bin_dir / name
        stub.write_text(
            "#!/bin/bash\n"
            f'{{ printf "%s\\0" {name} "$@"; printf "\\n"; }} >> "$CALLS"\n'
            f"printf '%s\\n' {shlex.quote(output)}\n"
        )
        stub.chmod(0o755)
    env = {
        **os.environ,
        "CALLS": str(log),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_ID": "42",
        "RDZV_HOST": "node1",
    }
    subprocess.run(
        ["bash", str(path), *args],
        env=env,
        check=True,
        timeout=30,
        capture_output=True,
        cwd=cwd or path.parent,
    )
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines() if line]
    log.unlink()
    return calls


def bash_syntax_ok(path: Path) -> None:
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)


def torchrun_args(argv: list[str]) -> argparse.Namespace:
    """torchrun's own parser (torch.distributed.run) on the options after `torchrun`."""
    from torch.distributed.run import get_args_parser

    return get_args_parser().parse_args(argv)


def flags_parser(table_file: str) -> argparse.ArgumentParser:
    """A parser for the flags listed in tests/data/export/<table_file> (switch, choices, type,
    strs for a list of words)."""
    table = yaml.safe_load((DATA / table_file).read_text())["flags"]
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    _add_flags(parser, table)
    return parser


def _add_flags(parser: argparse.ArgumentParser, table: dict) -> None:
    types = {"int": int, "float": float, "str": str}
    for flag, kind in table.items():
        if kind == "switch":
            parser.add_argument(flag, action="store_true")
        elif isinstance(kind, list):
            parser.add_argument(flag, choices=kind)
        elif kind == "strs":  # a list flag: nargs='*', type=str
            parser.add_argument(flag, nargs="*", type=str)
        else:
            parser.add_argument(flag, type=types[kind])


def megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's parser for the flags autoplan uses, rebuilt from tests/data/export."""
    return flags_parser("megatron_flags.yaml")


def export_files(tmp_path: Path, target: str, plan: Any, fmt: str = "python") -> dict[str, Path]:
    """The target's files for `plan` (8 GPUs a node), written under tmp_path: name -> path."""
    from autoplan.export.base import ExportOptions, export_plan
    from autoplan.export.registry import get_target

    files = export_plan(get_target(target), plan, plan.model_spec(),
                        ExportOptions(gpus_per_node=8, torchtitan_format=fmt))
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / name
        out[name].write_text(text)
    return out


def launch_argv(path: Path, script: str = "pretrain_gpt.py") -> list[str]:
    """The flags a launch script passes to `script` (its torchrun or deepspeed call)."""
    [call] = run_script(path, {"torchrun": "", "deepspeed": ""})
    return call[call.index(script) + 1:]


def megatron_core_model(argv: list[str]) -> dict[str, Any]:
    """In a spawned process (ProcessPoolExecutor with the spawn context): Megatron-Core's
    GPTModel (local layer spec, one CPU rank) built from the parsed launch flags; its parameter
    count, its bias tensors' names and its q/k norms with their eps."""
    import os
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(1, 1)
    ns = megatron_parser().parse_args(argv)
    config = TransformerConfig(
        num_layers=ns.num_layers, hidden_size=ns.hidden_size, ffn_hidden_size=ns.ffn_hidden_size,
        num_attention_heads=ns.num_attention_heads,
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        add_bias_linear=not ns.disable_bias_linear, add_qkv_bias=ns.add_qkv_bias,
        gated_linear_unit=ns.swiglu, normalization=ns.normalization,
        layernorm_epsilon=ns.norm_epsilon, qk_layernorm=ns.qk_layernorm,
        use_cpu_initialization=True, params_dtype=torch.float32)
    spec = get_gpt_layer_local_spec(qk_layernorm=ns.qk_layernorm, normalization=ns.normalization)
    model = GPTModel(config, spec, vocab_size=ns.vocab_size + 1,  # NullTokenizer's EOD token
                     max_sequence_length=ns.seq_length,
                     position_embedding_type=ns.position_embedding_type,
                     share_embeddings_and_output_weights=not ns.untie_embeddings_and_output_weights)
    norms = [(n, float(getattr(m, "eps", getattr(m, "variance_epsilon", -1.0))))
             for n, m in model.named_modules() if n.endswith(("q_layernorm", "k_layernorm"))]
    return {"params": sum(p.numel() for p in model.parameters()),
            "biases": [n for n, _ in model.named_parameters() if n.endswith("bias")],
            "norms": norms}


TORCHTITAN_0_3_0_NAMES = {
    # what the Python config imports beyond tests/data/export/torchtitan_fields.yaml, with the
    # fields of each dataclass, read with ast from the torchtitan 0.3.0 wheel: config/configs.py
    # CompileConfig; components/quantization/float8.py (each Config adds to
    # QuantizationConverter.Config's model_compile_enabled)
    "torchtitan.config": {
        "CompileConfig": ["enable", "enable_async_tensor_parallel", "components", "backend"]},
    "torchtitan.components.quantization": {
        "Float8LinearConverter.Config": ["recipe_name", "filter_fqns", "emulate",
                                         "model_compile_enabled"],
        "Float8GroupedExpertsConverter.Config": ["model_compile_enabled"]},
}


class StrictConfig:
    """A stand-in dataclass: takes only the keyword arguments torchtitan's has, keeps them."""

    fields: list[str] = []

    def __init__(self, **kw: Any) -> None:
        unknown = set(kw) - set(self.fields)
        assert not unknown, f"torchtitan's {type(self).__name__} has no {unknown}"
        self.kw = kw


def torchtitan_0_3_0_modules() -> dict[str, types.ModuleType]:
    """Stand-in modules for TORCHTITAN_0_3_0_NAMES (a Config nested in its converter class)."""
    modules = {}
    for module_name, names in TORCHTITAN_0_3_0_NAMES.items():
        module = types.ModuleType(module_name)
        for name, fields in names.items():
            owner, _, nested = name.partition(".")
            config = type(nested or owner, (StrictConfig,), {"fields": fields})
            setattr(module, owner, type(owner, (), {"Config": config}) if nested else config)
        modules[module_name] = module
    return modules
