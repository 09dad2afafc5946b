"""Seeded cases for the CLI fuzzer (tests/unit/test_fuzz_cli.py, benchmarks/fuzz_cli.py): valid
plans, specs, HF configs, spaces, profiles and DeepSpeed/Megatron configs, mutated as documents,
as text and as command-line values. `generate(seed)` is the same case on every machine."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

PLAN = {
    "schema_version": 1, "model": "tiny", "cluster": {"profile": "cpu-gloo", "num_gpus": 4},
    "parallel": {"dp": 2, "tp": 2, "pp": 1, "cp": 1}, "sequence_parallel": True,
    "pipeline": {"schedule": "1f1b", "vpp": 1}, "zero_stage": 1,
    "offload": {"optimizer": False, "params": False},
    "recompute": {"policy": "full", "num_layers": 2},
    "batch": {"micro_batch_size": 2, "global_batch_size": 8}, "precision": "fp32",
    "attention": "flash",
}
BIG_PLAN = {
    "model": "gpt3-1.3b", "cluster": {"profile": "h100-sxm-80gb", "num_gpus": 16},
    "parallel": {"dp": 4, "tp": 2, "pp": 2}, "zero_stage": 1,
    "batch": {"micro_batch_size": 1, "global_batch_size": 64},
}
MODEL = {"name": "m", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
         "ffn_hidden_size": 128, "vocab_size": 256, "seq_len": 64, "mlp": "swiglu",
         "norm": "rmsnorm", "position": "rope", "bias": False, "tie_embeddings": True}
HF_CONFIGS = [
    {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 256,
     "max_position_embeddings": 128, "hidden_act": "silu", "tie_word_embeddings": False},
    {"model_type": "gemma2", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 128, "vocab_size": 256,
     "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh"},
    {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
     "n_positions": 64},
]
DEEPSPEED = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
             "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2},
             "bf16": {"enabled": False}, "fp16": {"enabled": False},
             "activation_checkpointing": {"partition_activations": False}}
MEGATRON = [
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "64", "--max-position-embeddings", "64", "--vocab-size", "256",
    "--micro-batch-size", "1", "--global-batch-size", "8", "--recompute-granularity", "full",
    "--recompute-method", "uniform", "--attention-backend", "flash",
    "--pipeline-model-parallel-layout", "Et*2|t*2L",
]


def _shipped(folder: str, name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / folder / name).read_text())


SPACE = _shipped("search_spaces", "small-cpu.yaml")
PROFILE = _shipped("profiles", "cpu-gloo.yaml")

HOSTILE_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2, 3, 7, 2**31, 2**53 + 1, 2**63, 10**30, 1.5, -0.0, 1e308,
    float("nan"), float("inf"), "", " ", "abc", "1e12", "auto", "\n", "a\nb", "x" * 3000,
    "../x", "$(id)", "\u0663", "tiny", "full", [], [1, 2], [[[]]], {}, {"a": 1}, {"enabled": True},
    [True],
]
PLAUSIBLE_VALUES: list[Any] = [
    0, 1, 2, 4, 8, 16, 64, True, False, None, "none", "full", "selective", "bf16", "fp16", "fp32",
    "1f1b", "gpipe", "interleaved-1f1b", "zero-bubble", "flash", "eager", "swiglu", "gelu",
    "geglu", "rmsnorm", "layernorm", "rope", "learned", "cpu", [1, 1, 2], 0.1, 0.5,
]
"""Values of the right kind for some field, so that mutated files also reach the cost model,
the rules and the exporters, not only the loaders."""
HOSTILE_TEXT = [
    "a: &a [1, *a]\n",
    "".join(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9) if i else '1,1,1,1,1,1,1,1,1'}]\n"
            for i in range(9)),
    "x: " + "[" * 300 + "]" * 300 + "\n",
    "x: !!python/object/apply:os.system ['echo hi']\n",
    "\t- bad: indent\n", "\x00\x01\x02", "\ufeffkey: value\n", "key: 9" + "9" * 5000 + "\n",
    "{", "]", "key: [unclosed\n", "? complex\n: key\n", "%YAML 9.9\n---\n", "---\n---\n",
]
HOSTILE_ARGS = [
    "-1", "0", "1", "2", "3", "8", "99999999999999999999", "4611686018427387904", "1e3", "nan",
    "inf", "", " ", "\u0663", "1_0", "0x10", "$(id)", "a\nb", "../x", "/", "x" * 300, "-",
    "tiny", "cpu-gloo", "1,2,3", "4..8", "1..3000000000", "a=b", "parallel.tp=2",
    "parallel.tp=[[[[1]]]]", "batch=3", "zero_stage=9", "model.hidden_size=99999999999999999999",
]


@dataclass
class Case:
    """One command line and the files it reads, written into an empty directory first."""

    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)


# ---- mutations ----------------------------------------------------------------------------------


def _paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    if prefix:
        yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _paths(value, (*prefix, i))


def mutate_doc(rng: random.Random, base: Any, max_edits: int = 3) -> Any:
    """Replace, delete or add a few values anywhere in a copy of `base`."""
    doc = copy.deepcopy(base)
    for _ in range(rng.randint(0, max_edits)):
        paths = list(_paths(doc))
        if not paths:
            break
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        pool = PLAUSIBLE_VALUES if rng.random() < 0.6 else HOSTILE_VALUES
        value = copy.deepcopy(rng.choice(pool))
        if action < 0.6:
            parent[path[-1]] = value
        elif action < 0.8:
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(["extra", "name", "stage", "enabled", "1", ""])] = value
    return doc


def render(rng: random.Random, doc: Any, as_json: bool = False) -> str | bytes:
    """The document as YAML or JSON text, sometimes damaged at the text level."""
    if as_json:
        text = json.dumps(doc)  # NaN/Infinity: Python writes them, strict readers refuse them
    else:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    roll = rng.random()
    if roll < 0.5:
        return text
    if roll < 0.58:
        return text[: rng.randint(0, len(text))]
    if roll < 0.66:
        return text + rng.choice(HOSTILE_TEXT)
    if roll < 0.70:
        return rng.choice(HOSTILE_TEXT)
    if roll < 0.73:
        raw = bytearray(text.encode())
        if raw:
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if roll < 0.75:
        return text.encode("utf-16")
    return text


def mutate_args(rng: random.Random, argv: list[str], p: float = 0.25) -> list[str]:
    """Swap a few values for hostile ones, drop or repeat a flag, add an unknown one."""
    out = list(argv)
    if rng.random() < 0.4:  # many cases keep their values, to go past the argument checks
        return out
    for i in range(1, len(out)):  # the sub-command stays
        if not out[i].startswith("--") and rng.random() < p:
            out[i] = rng.choice(HOSTILE_ARGS)
    roll = rng.random()
    flags = [i for i, a in enumerate(out) if a.startswith("--")]
    if roll < 0.05 and flags:
        i = rng.choice(flags)
        del out[i: i + 2]
    elif roll < 0.08:
        out += ["--bogus-flag", "1"]
    elif roll < 0.11 and flags:
        i = rng.choice(flags)
        out += out[i: i + 2]
    return [a.replace("\x00", "") for a in out]  # argv cannot hold NUL


# ---- case generators ----------------------------------------------------------------------------


def _format(rng: random.Random) -> list[str]:
    return rng.choice([["--format", "json"], ["--format", "json"], ["--format", "yaml"],
                       ["--format", "table"], []])


def gen_estimate(rng: random.Random) -> Case:
    if rng.random() < 0.5:
        plan = mutate_doc(rng, rng.choice([PLAN, BIG_PLAN]))
        if rng.random() < 0.2:
            plan["model"] = "model.yaml"
            files = {"plan.yaml": render(rng, plan), "model.yaml": render(rng, mutate_doc(rng, MODEL))}
        else:
            files = {"plan.yaml": render(rng, plan)}
        argv = ["estimate", "--plan", "plan.yaml"]
        if rng.random() < 0.3:
            argv += ["--set", rng.choice(HOSTILE_ARGS[-6:] + ["parallel.dp=4", "zero_stage=2"])]
        return Case(mutate_args(rng, argv + _format(rng), 0.1), files)
    files: dict[str, str | bytes] = {}
    model = rng.choice(["tiny", "tiny-llama", "gpt3-1.3b", "llama-3-8b", "model.yaml",
                        "config.json"])
    if model == "model.yaml":
        files[model] = render(rng, mutate_doc(rng, MODEL))
    elif model == "config.json":
        files[model] = render(rng, mutate_doc(rng, rng.choice(HF_CONFIGS)), as_json=True)
    cluster = rng.choice(["cpu-gloo", "h100-sxm-80gb", "a100-sxm4-80gb", "profile.yaml"])
    if cluster == "profile.yaml":
        files[cluster] = render(rng, mutate_doc(rng, PROFILE))
    argv = ["estimate", "--model", model, "--cluster", cluster,
            "--num-gpus", rng.choice(["1", "2", "4", "8", "16"])]
    if rng.random() < 0.4:
        argv += ["--seq-len", rng.choice(["64", "128", "2048"])]
    if rng.random() < 0.4:
        argv += ["--global-batch-size", rng.choice(["8", "16", "64"])]
    if rng.random() < 0.2:
        argv += ["--micro-batch-size", rng.choice(["1", "2"])]
    return Case(mutate_args(rng, argv + _format(rng)), files)


def gen_search(rng: random.Random) -> Case:
    files: dict[str, str | bytes] = {}
    space = "small-cpu"
    if rng.random() < 0.5:
        space = "space.yaml"
        files[space] = render(rng, mutate_doc(rng, SPACE, 2))
    model = rng.choice(["tiny", "tiny-llama", "model.yaml"])
    if model == "model.yaml":
        files[model] = render(rng, mutate_doc(rng, MODEL, 2))
    argv = ["search", "--model", model, "--cluster", "cpu-gloo",
            "--num-gpus", rng.choice(["2", "4", "1..8", "2,4"]),
            "--global-batch-size", rng.choice(["8", "16"]), "--space", space]
    if rng.random() < 0.3:
        argv += ["--objective", rng.choice(["throughput", "memory", "throughput,memory", "mfu",
                                            "bogus"])]
    if rng.random() < 0.2:
        argv += ["--sampler", rng.choice(["exhaustive", "random", "tpe"]), "--trials",
                 rng.choice(["5", "10", "0", "-3"])]
    if rng.random() < 0.2:
        argv += ["--top", rng.choice(["1", "3", "0"])]
    if rng.random() < 0.2:
        argv += ["--max-step-time-s", rng.choice(["0.001", "10", "nan", "-1"])]
    if rng.random() < 0.2:
        argv += ["--out", rng.choice(["out", "plan.yaml", "a/b/c"])]
        if rng.random() < 0.3:
            files["plan.yaml"] = "existing\n"
    argv += _format(rng)
    argv = mutate_args(rng, argv, 0.08)
    if "--trials" in argv:  # keep the number of Optuna trials small: speed, not a finding
        i = argv.index("--trials")
        if i + 1 < len(argv) and argv[i + 1].lstrip("-").isdigit() and int(argv[i + 1]) > 20:
            argv[i + 1] = "20"
    elif "--sampler" in argv:
        argv += ["--trials", "10"]
    return Case(argv, files)


EXPORT_TARGETS = ["slurm", "kubernetes", "torchrun", "deepspeed", "megatron", "torchtitan"]


def gen_export(rng: random.Random) -> Case:
    plan = mutate_doc(rng, rng.choice([PLAN, BIG_PLAN]), 1)
    files: dict[str, str | bytes] = {"plan.yaml": render(rng, plan)}
    argv = ["export", "plan.yaml", "--to", rng.choice(EXPORT_TARGETS)]
    options = {
        "--job-name": ["llm", "a\nrm -rf $HOME", "My_Job Name!", "../x", "a" * 70, "ok-1"],
        "--namespace": ["ml", "../x", "UP", "a.b"],
        "--checkpoint-dir": ["ck", "c k", "a\nb", "/abs/ck"],
        "--gpus-per-node": ["8", "4", "0", "-1", "3"],
        "--max-restarts": ["3", "-1", "0"],
        "--image": ["img:1", "a\nb"],
        "--kind": ["trainjob", "pytorchjob", "jobset"],
        "--torchtitan-format": ["python", "toml"],
        "--script": ["pretrain_gpt.py", "x y.py", "$(id)"],
    }
    for flag, values in options.items():
        if rng.random() < 0.25:
            argv += [f"{flag}={rng.choice(values)}"]
    if rng.random() < 0.3:
        out = rng.choice(["out.txt", "dir/out.txt", "plan.yaml", "sub"])
        argv += ["--out", out]
        if out == "sub":
            files["sub/keep.txt"] = "mine\n"
        if rng.random() < 0.3:
            argv.append("--force")
    argv += rng.choice([[], ["--format", "json"], ["--format", "yaml"]])
    return Case(mutate_args(rng, argv, 0.05), files)


def gen_import(rng: random.Random) -> Case:
    if rng.random() < 0.5:
        files: dict[str, str | bytes] = {
            "ds.json": render(rng, mutate_doc(rng, DEEPSPEED), as_json=True)}
        argv = ["import", "ds.json", "--from", "deepspeed", "--model",
                rng.choice(["tiny", "gpt3-1.3b", "model.yaml"])]
        files["model.yaml"] = render(rng, mutate_doc(rng, MODEL, 1))
    else:
        flags = mutate_args(rng, MEGATRON, 0.15)
        text = " \\\n  ".join(flags) if rng.random() < 0.5 else " ".join(flags)
        files = {"args.txt": "torchrun pretrain_gpt.py " + text + "\n"}
        argv = ["import", "args.txt", "--from", "megatron"]
    argv += ["--cluster", rng.choice(["cpu-gloo", "h100-sxm-80gb"]),
             "--num-gpus", rng.choice(["4", "8", "16"])]
    if rng.random() < 0.2:
        argv += ["--set", rng.choice(HOSTILE_ARGS[-6:])]
    if rng.random() < 0.2:
        argv += ["--out", rng.choice(["plan.yaml", "new.yaml", "d/new.yaml"])]
    argv += rng.choice([[], ["--format", "json"]])
    return Case(mutate_args(rng, argv, 0.05), files)


def gen_list(rng: random.Random) -> Case:
    return Case(mutate_args(rng, [rng.choice(["models", "clusters"]), *_format(rng)], 0.1))


GENERATORS: list[tuple[float, Callable[[random.Random], Case]]] = [
    (0.35, gen_estimate), (0.07, gen_search), (0.25, gen_export), (0.28, gen_import),
    (0.05, gen_list),
]


def generate(seed: int) -> Case:
    """The case of one seed (the same on every machine and run)."""
    rng = random.Random(seed)
    roll, total = rng.random(), 0.0
    for weight, gen in GENERATORS:
        total += weight
        if roll < total:
            return gen(rng)
    return GENERATORS[-1][1](rng)
