"""Every command the README shows runs as written, in order, on a copy of the checkout, and does
what the text says (issue #16).

The commands are read from the README's ```bash blocks (and its inline `python benchmarks/...`
commands), so an example edited there is tested as edited. Only the sizes in REDUCED change,
each for the reason given; every command must have a CHECK, so a new example needs one too.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

REDUCED = {
    # training steps: each one is real work on 2 CPU cores (the README's 50/60/20 steps become
    # 6/8/3, with a checkpoint every 3 so that --resume has one to continue from)
    "--steps 50": "--steps 6", "--checkpoint-every 10": "--checkpoint-every 3",
    "--steps 60": "--steps 8", "--steps 20": "--steps 3",
    # TPE trials: 300 -> 30 for the storage example (the 64..1024 search keeps its default)
    "--trials 300": "--trials 30",
    # tune: 2 plans of 3 steps instead of 8 plans of 8 steps
    "--top 8 --steps 8 --budget-s 600": "--top 2 --steps 3 --budget-s 300",
    # profile: collectives over 2 ranks instead of 4
    "profile --quick": "profile --quick --ranks 2",
    # the speed benchmark: 20,000 rows once instead of 1,000,000 rows three times
    "benchmarks/estimate_speed.py": "benchmarks/estimate_speed.py --rows 20000 --repeats 1",
}
SKIP = ("python -m pip install", "python -m pytest")
"""Set-up already done by the environment that runs this test, and this test suite itself."""
SLOW = ("benchmarks/closed_loop.py",)
"""Runs 18 real plans after profiling the machine: only in the slow tier (`pytest -m slow`)."""


def readme_commands(text: str) -> list[str]:
    """Shell commands in README order: ```bash blocks (continuations joined), then inline
    `python benchmarks/...` spans not shown in a block."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            for part in line.split(" && "):  # one command per part, as a shell runs them
                part = " ".join(part.split())
                if part and not part.startswith("#") and not part.startswith(SKIP):
                    commands.append(part)
    for span in re.findall(r"`(python benchmarks/[^`]+)`", text):
        if not any(span in c for c in commands) and span not in commands:
            commands.append(span)
    return commands


def reduce(command: str) -> str:
    for full, small in REDUCED.items():
        command = re.sub(rf"(?<!\S){re.escape(full)}(?!\S)", small, command)
    return command


def argv(command: str, cwd: Path) -> list[str]:
    """The command as a process argument list (no shell): comments dropped, globs expanded."""
    words = shlex.split(command, comments=True)
    out: list[str] = []
    for w in words:
        out += sorted(glob.glob(w, root_dir=cwd)) or [w] if any(c in w for c in "*?[") else [w]
    head = {"python": [sys.executable], "autoplan": [shutil.which("autoplan") or sys.executable,
                                                      *([] if shutil.which("autoplan")
                                                        else ["-m", "autoplan.commands"])],
            "torchrun": [shutil.which("torchrun") or sys.executable,
                         *([] if shutil.which("torchrun") else ["-m", "torch.distributed.run"])]}
    return head.get(out[0], [out[0]]) + out[1:]


@dataclass
class Ran:
    rc: int
    out: str
    err: str
    cwd: Path

    def json(self) -> dict:
        return json.loads(self.out)


def table_fits(r: Ran) -> None:
    assert "…" not in r.out and max(len(line) for line in r.out.splitlines()) <= 80
    assert "legend:" in r.out and "why this plan" in r.out


def imported_as_exported(r: Ran) -> None:
    """The plan read back from the DeepSpeed export has the searched plan's layout and batch."""
    mine = yaml.safe_load((r.cwd / "mine.yaml").read_text())
    searched = yaml.safe_load((r.cwd / "runs/gpt13b/plan.yaml").read_text())
    for key in ("parallel", "batch", "zero_stage", "sequence_parallel"):
        assert mine[key] == searched[key], (key, mine[key], searched[key])


def wrote(*names: str) -> Callable[[Ran], None]:
    def check(r: Ran) -> None:
        for name in names:
            assert (r.cwd / name).is_file(), name
            assert f"wrote {name}" in r.err, name
    return check


def llama70b(r: Ran) -> None:
    wrote("runs/llama70b/plan.yaml", "runs/llama70b/top.yaml", "runs/llama70b/trials.csv.gz",
          "runs/llama70b/summary.json", "runs/llama70b/report.html")(r)
    assert r.json()["feasible"] and r.json()["best"]["model"] == "llama-3-70b"
    with gzip.open(r.cwd / "runs/llama70b/trials.csv.gz", "rt") as fh:
        assert fh.readline().startswith("row,")
    page = (r.cwd / "runs/llama70b/report.html").read_text()
    assert "<h2>Ranked plans</h2>" in page and "data:image/png;base64," in page


def trained(r: Ran) -> None:
    lines = (r.cwd / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[-1])["step"] == 6
    assert (r.cwd / "runs/tiny-run.json").is_file() and any((r.cwd / "ckpt").iterdir())
    assert r.json()["final_step"] == 6


def profiled(r: Ran) -> None:
    from autoplan.hardware import load_profile

    prof = load_profile(str(r.cwd / "my-machine.yaml"))
    assert prof.measured is not None


def calibrated(r: Ran) -> None:
    data = r.json()
    assert data["runs"] == 1 and "step_time_mape_after" in data
    assert yaml.safe_load((r.cwd / "my-machine-fitted.yaml").read_text())


def megatron_winner(r: Ran) -> None:
    """search --runtime megatron keeps to what Megatron runs: its schedules and ZeRO 0-1."""
    from autoplan.cost.runtimes import load_runtime

    traits = load_runtime("megatron")
    best = r.json()["best"]
    assert r.json()["feasible"] and best["zero_stage"] in traits.zero_stages
    assert best["pipeline"]["schedule"] in traits.schedules


# (start of the README command, exit code, what must hold afterwards)
CHECKS: list[tuple[str, int, Callable[[Ran], None]]] = [
    ("autoplan search --model gpt3-175b --cluster a100-sxm4-80gb --num-gpus 1024 "
     "--global-batch-size 1536 --format table", 0, table_fits),
    ("autoplan estimate --model llama-3-8b", 0,
     lambda r: (assert_in("dp=32 tp=2", r.out), assert_in("feasible", r.out))),
    ("autoplan search --model llama-3-70b", 0, llama70b),
    ("autoplan estimate --plan runs/llama70b/plan.yaml", 0,
     lambda r: assert_in("full", r.json()["plan"]["recompute"]["policy"])),
    ("autoplan search --model gpt3-175b --cluster a100-sxm4-80gb --num-gpus 64..1024", 0,
     lambda r: assert_in("gpus", r.json()["objectives"])),
    ("autoplan search --model gpt3-13b --cluster a100-sxm4-80gb --num-gpus 64 "
     "--global-batch-size 512 --sampler tpe", 0,
     lambda r: (assert_in("tpe", r.json()["sampler"]), assert_in("study.db", os.listdir(r.cwd)))),
    ("autoplan search --model tiny", 0, wrote("runs/tiny/plan.yaml")),
    ("autoplan train runs/tiny/plan.yaml --nproc 4", 0, trained),
    ("autoplan train runs/tiny/plan.yaml --steps 60 --resume", 0,
     lambda r: assert_in((6, 8), [(r.json()["resumed_from"], r.json()["final_step"])])),
    ("torchrun --nproc-per-node 4", 0, lambda r: assert_in('"final_step": 3', r.out)),
    ("autoplan train runs/tiny/plan.yaml --nproc 3 --elastic", 0, lambda r: (
        assert_in("rank 2 idle", r.err),
        assert_in("plan-2gpus.yaml", os.listdir(r.cwd / "ckpt-elastic/elastic-plans")))),
    ("autoplan export runs/tiny/plan.yaml --to slurm --elastic", 0,
     lambda r: assert_in("--no-kill", (r.cwd / "train-elastic.sbatch").read_text())),
    ("autoplan profile --quick", 0, profiled),
    ("autoplan calibrate runs/tiny-run.json", 0, calibrated),
    ("autoplan tune --model tiny", 0, lambda r: assert_in("plan.yaml",
                                                          os.listdir(r.cwd / "runs/tune"))),
    ("python benchmarks/closed_loop.py --calibrate", 0, lambda r: None),
    ("autoplan export runs/tiny/plan.yaml --to slurm --out", 0,
     lambda r: assert_in("#SBATCH", (r.cwd / "train.sbatch").read_text())),
    ("autoplan search --model gpt3-13b --cluster a100-sxm4-80gb --num-gpus 64 "
     "--global-batch-size 512 --out runs/gpt13b", 0, wrote("runs/gpt13b/plan.yaml")),
    ("autoplan export runs/gpt13b/plan.yaml --to deepspeed", 0,
     lambda r: assert_in("zero_optimization", json.loads((r.cwd / "ds.json").read_text()))),
    ("autoplan import ds.launch.sh --from deepspeed", 0, imported_as_exported),
    ("autoplan estimate --plan mine.yaml", 0, lambda r: assert_in(True, [r.json()["feasible"]])),
    ("python benchmarks/published_accuracy.py", 0, lambda r: assert_in("%", r.out)),
    ("autoplan estimate --model llama-3-70b --cluster h100-sxm-80gb", 0,
     lambda r: assert_in("megatron", [r.json()["runtime"]])),
    ("autoplan search --model gpt3-175b --cluster a100-sxm4-80gb --num-gpus 1024 "
     "--global-batch-size 1536 --runtime megatron", 0, megatron_winner),
    ("autoplan search --model gpt3-13b --cluster a100-sxm4-80gb,h100-sxm-80gb,h200-sxm-141gb", 0,
     lambda r: assert_in("h100-sxm-80gb", [c["cluster"] for c in r.json()["by_cluster"]])),
    ("python benchmarks/practitioner.py", 0, lambda r: assert_in("mean absolute error", r.out)),
    ("python benchmarks/schema_fidelity.py", 0, lambda r: assert_in("same price", r.out)),
    ("python benchmarks/gemm_published.py", 0,
     lambda r: (assert_in("xla-sm90-bf16", r.out), assert_in("curve alone", r.out))),
    ("python benchmarks/residuals.py", 0,
     lambda r: (assert_in("MPT Training Benchmarks", r.out), assert_in("best pair:", r.out))),
    ("python benchmarks/estimate_speed.py", 0, lambda r: assert_in("plans/s", r.out)),
]


def assert_in(needle, haystack) -> None:
    assert needle in haystack, f"{needle!r} not in {str(haystack)[-400:]!r}"


def check_for(command: str) -> tuple[int, Callable[[Ran], None]]:
    found = [(rc, f) for start, rc, f in CHECKS if command.startswith(start)]
    assert len(found) == 1, f"README command needs exactly one CHECK entry: {command}"
    return found[0]


def fresh_copy(dest: Path) -> Path:
    """The checkout's files as a fresh clone would have them (tracked and new, not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    if listed.returncode != 0:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", "runs", "__pycache__"))
        return dest
    for name in filter(None, listed.stdout.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def run_readme(tmp_path: Path, include_slow: bool) -> None:
    clone = fresh_copy(tmp_path / "clone")
    env = {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1",
           "AUTOPLAN_PROFILES": str(tmp_path / "user-profiles")}
    commands = readme_commands(README.read_text(encoding="utf-8"))
    assert len(commands) >= 15, commands
    for command in commands:
        rc, check = check_for(command)
        if any(s in command for s in SLOW) and not include_slow:
            continue
        cmd = argv(reduce(command), clone)
        proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True,
                              timeout=1200)
        ran = Ran(proc.returncode, proc.stdout, proc.stderr, clone)
        assert ran.rc == rc, f"{command}\n-> exit {ran.rc}\n{ran.err[-3000:]}"
        try:
            check(ran)
        except AssertionError as err:
            raise AssertionError(f"{command}: {err}\n{ran.err[-2000:]}") from None


def test_every_readme_command_has_a_check_and_a_size() -> None:
    commands = readme_commands(README.read_text(encoding="utf-8"))
    for command in commands:
        check_for(command)
    text = " ".join(commands)
    for full in REDUCED:
        assert full in text, f"REDUCED names {full!r}, which the README no longer shows"
    assert "<!-- ci:setup -->" in README.read_text() and "<!-- ci:test -->" in README.read_text()


@pytest.mark.dist
@pytest.mark.timeout(1800)  # ~20 commands, 3 of them real training; minutes on 2 cores
def test_readme_commands_run_in_order(tmp_path: Path) -> None:
    run_readme(tmp_path, include_slow=False)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_readme_commands_run_in_order_with_the_closed_loop(tmp_path: Path) -> None:
    run_readme(tmp_path, include_slow=True)
