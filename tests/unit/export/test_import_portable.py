"""An imported plan names its model and profile as search's plans do: a model file inline and a
profile path absolute, so the plan reads the same from any folder. Import wrote both as typed,
which held only from the folder it ran in (estimate elsewhere: "no such file"; an export that
cds into the plan's folder refused the relative path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
MODEL = {"schema_version": 1, "name": "mini", "num_layers": 4, "hidden_size": 256,
         "num_heads": 4, "vocab_size": 1000, "seq_len": 128}
LAUNCH = ("torchrun pretrain_gpt.py --tensor-model-parallel-size 1 "
          "--pipeline-model-parallel-size 1 --num-layers 4 --hidden-size 256 "
          "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
          "--micro-batch-size 2 --global-batch-size 4 --bf16\n")


def cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *argv], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env={**os.environ, "COLUMNS": "200"})


def test_an_imported_plan_reads_from_another_folder(tmp_path: Path) -> None:
    work, other = tmp_path / "work", tmp_path / "other"
    (work / "profiles").mkdir(parents=True)
    other.mkdir()
    (work / "mini.yaml").write_text(yaml.safe_dump(MODEL))
    shutil.copy(ROOT / "profiles" / "cpu-gloo.yaml", work / "profiles" / "mine.yaml")
    (work / "run.sh").write_text(LAUNCH)
    done = cli(["import", "run.sh", "--from", "megatron", "--model", "mini.yaml", "--cluster",
                "profiles/mine.yaml", "--num-gpus", "2", "--out", "plans/p.yaml"], work)
    assert done.returncode == 0, done.stderr
    plan = yaml.safe_load((work / "plans" / "p.yaml").read_text())
    assert plan["model"]["name"] == "mini" and plan["model"]["num_layers"] == 4
    assert plan["cluster"]["profile"] == str((work / "profiles" / "mine.yaml").resolve())
    priced = cli(["estimate", "--plan", str(work / "plans" / "p.yaml"), "--format", "json"],
                 other)
    assert priced.returncode == 0, priced.stderr
    assert '"model": "mini"' in priced.stdout


def test_a_preset_and_a_profile_name_stay_names(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"train_batch_size": 8, '
                                      '"train_micro_batch_size_per_gpu": 2, '
                                      '"gradient_accumulation_steps": 2, "bf16": {"enabled": true}}')
    done = cli(["import", "ds.json", "--from", "deepspeed", "--model", "tiny", "--cluster",
                "cpu-gloo", "--num-gpus", "2"], tmp_path)
    assert done.returncode == 0, done.stderr
    plan = yaml.safe_load(done.stdout)
    assert plan["model"] == "tiny" and plan["cluster"]["profile"] == "cpu-gloo"
