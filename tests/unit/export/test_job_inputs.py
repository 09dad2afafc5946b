"""What the torchrun and SLURM jobs read from disk besides their script: the model and profile
files the plan names (relative paths resolved from the plan's folder, their SHA-256 checked with
the plan's), the checkpoint folder (absolute, as export resolved it) and `--data` (checked as
`autoplan train` checks it, or synthetic tokens, said in the script); Kubernetes' --data is a
path inside the pod."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoplan import resources
from autoplan.commands import main
from autoplan.errors import ConfigError
from autoplan.export.job_inputs import check_data
from autoplan.model_spec import PRESETS
from autoplan.plan import Batch, ClusterRef, Parallel, Plan
from autoplan.plan_files import save_plan
from autoplan.yaml_io import dump_yaml, read_yaml, to_dict
from tests.cli_refusals import assert_refused

SCRIPTS = {"torchrun": "launch.sh", "slurm": "job.sbatch"}
TINY = PRESETS["tiny"]


def _plan_beside_its_files(folder: Path, model: str = "model.yaml",
                           profile: str = "site.yaml") -> Path:
    """A CPU plan naming its model and profile by paths relative to its folder, as a user
    writes one beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.yaml").write_text(dump_yaml(to_dict(TINY.replace(name="mine"))))
    cpu = resources.find(resources.PROFILES, "cpu-gloo")
    assert cpu is not None
    (folder / "site.yaml").write_text(dump_yaml(read_yaml(cpu, "profile")))
    plan = Plan(model=model, cluster=ClusterRef(profile, 4), parallel=Parallel(dp=4),
                batch=Batch(micro_batch_size=2, global_batch_size=8))
    return save_plan(plan, folder / "plan.yaml")


def _export(folder: Path, target: str, *flags: str) -> Path:
    script = folder / SCRIPTS[target]
    assert main(["export", "plan.yaml", "--to", target, "--out", str(script), *flags]) == 0
    return script


def _run(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    """Run the script from `cwd` with torchrun (and srun) replaced by a rank's first reads:
    the plan, its model and its profile, loaded as `autoplan train` loads them, from the
    working directory the launcher leaves them."""
    bin_dir = script.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    rank = ("import sys\nfrom autoplan.plan_files import load_plan\n"
            "from autoplan.hardware import load_profile\n"
            "argv = sys.argv[1:]\nplan = load_plan(argv[argv.index('train') + 1])\n"
            "plan.model_spec()\nload_profile(plan.cluster.profile)\n"
            "print('rank read', ' '.join(argv[argv.index('train'):]))\n")
    (bin_dir / "rank.py").write_text(rank)
    for name in ("torchrun", "srun"):
        (bin_dir / name).write_text(
            f"#!/bin/bash\nexec {shlex.quote(sys.executable)} {bin_dir / 'rank.py'} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node1\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7"}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def _train_flags(line: str) -> argparse.Namespace:
    from autoplan.runtime.cli import add_train_arguments

    words = line.split()
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(words[words.index("train") + 1:])


@pytest.mark.parametrize("target", list(SCRIPTS))
def test_a_plan_naming_files_beside_it_trains_from_any_folder(tmp_path, monkeypatch, target):
    """`model: model.yaml` and `cluster.profile: site.yaml` were read against the job's
    working directory: run from another folder, every rank failed with 'no such file'."""
    folder = tmp_path / "runs"
    _plan_beside_its_files(folder)
    monkeypatch.chdir(folder)
    script = _export(folder, target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _run(script, elsewhere)
    assert done.returncode == 0, done.stderr
    [line] = [x for x in done.stdout.splitlines() if x.startswith("rank read")]
    train = _train_flags(line)
    assert train.plan == str(folder / "plan.yaml")
    # the checkpoints of every start, wherever the script is run from, where export said
    assert train.checkpoint_dir == str(folder / "checkpoints") and train.data is None
    assert "# no --data: `autoplan train` trains on synthetic tokens" in script.read_text()


@pytest.mark.parametrize("target", list(SCRIPTS))
@pytest.mark.parametrize("edited", ["model.yaml", "site.yaml"])
def test_a_file_the_plan_names_edited_since_export_stops_the_job(tmp_path, monkeypatch, target,
                                                                 edited):
    """The plan's hash held, but its model file (or profile) was edited after the export:
    the job trained another model under the exported job's name."""
    _plan_beside_its_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    script = _export(tmp_path, target)
    field = "model" if edited == "model.yaml" else "cluster.profile"
    with open(tmp_path / edited, "a") as fh:
        fh.write("# edited\n")
    done = _run(script, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"{tmp_path / edited} ({field} of the plan) is missing or "
                                   "changed since autoplan export priced it; export the plan "
                                   "again")
    assert "rank read" not in done.stdout


@pytest.mark.parametrize("target", list(SCRIPTS))
def test_a_model_symlink_repointed_since_export_stops_the_job(tmp_path, monkeypatch, target):
    """The job opens model.yaml through the link: a link pointed at another model after the
    export must fail the check, though the file it pointed at is unchanged (review)."""
    _plan_beside_its_files(tmp_path)
    (tmp_path / "model.yaml").rename(tmp_path / "model-v1.yaml")
    (tmp_path / "model.yaml").symlink_to("model-v1.yaml")
    monkeypatch.chdir(tmp_path)
    script = _export(tmp_path, target)
    assert _run(script, tmp_path).returncode == 0
    (tmp_path / "model-v2.yaml").write_text(
        dump_yaml(to_dict(TINY.replace(name="mine", num_layers=2))))
    (tmp_path / "model.yaml").unlink()
    (tmp_path / "model.yaml").symlink_to("model-v2.yaml")
    done = _run(script, tmp_path)
    assert done.returncode == 2 and "(model of the plan) is missing or changed" in done.stderr
    assert "rank read" not in done.stdout


def test_absolute_paths_are_hashed_without_moving_the_job(tmp_path, monkeypatch):
    """A plan naming its files absolutely needs no folder of its own: the script does not cd,
    and the files are still checked."""
    folder = tmp_path / "p"
    _plan_beside_its_files(folder, model=str(folder / "model.yaml"),
                           profile=str(folder / "site.yaml"))
    monkeypatch.chdir(folder)
    text = _export(folder, "torchrun").read_text()
    assert "\ncd " not in text
    for name in ("model.yaml", "site.yaml"):
        assert f"sha256sum 2>/dev/null < {folder / name})" in text


@pytest.mark.parametrize("target", list(SCRIPTS))
def test_a_relative_path_is_read_from_the_plans_folder_wherever_export_runs(
        tmp_path, monkeypatch, target):
    """Exported from another folder that holds a model.yaml of its own, the plan's
    `model: model.yaml` is the plan folder's, as the job and `autoplan train` read it: export
    refused it ('a relative path ... write it in the plan as <a path that did not exist>')."""
    _plan_beside_its_files(tmp_path / "runs")
    (tmp_path / "model.yaml").write_text(dump_yaml(to_dict(TINY)))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / SCRIPTS[target]
    assert main(["export", "runs/plan.yaml", "--to", target, "--out", str(out)]) == 0
    text = out.read_text()
    assert f"sha256sum 2>/dev/null < {tmp_path / 'runs' / 'model.yaml'})" in text
    assert f"< {tmp_path / 'model.yaml'})" not in text
    done = _run(out, tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("target", [*SCRIPTS, "kubernetes"])
def test_data_reaches_autoplan_train(tmp_path, monkeypatch, target):
    """export had no --data: every exported job trained on synthetic tokens, unsaid."""
    _plan_beside_its_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("text " * 100)
    data = "/data/corpus" if target == "kubernetes" else "corpus"
    out = tmp_path / "job.out"
    assert main(["export", "plan.yaml", "--to", target, "--data", data, "--out", str(out)]) == 0
    text = out.read_text()
    if target == "kubernetes":
        doc = yaml.safe_load(text)
        line = doc["spec"]["trainer"]["command"][2].split("&&")[-1]
        expect = "/data/corpus"
    else:
        done = _run(out, tmp_path)
        assert done.returncode == 0, done.stderr
        [line] = [x for x in done.stdout.splitlines() if x.startswith("rank read")]
        expect = str(tmp_path / "corpus")  # absolute: the ranks read it from any folder
    assert _train_flags(line).data == expect
    assert f"# data: {expect} (byte-level text), read by every rank" in text
    assert "no --data" not in text


@pytest.mark.parametrize("argv, needle", [
    (["--to", "deepspeed", "--data", "/d"], "--data: --to deepspeed writes no data"),
    (["--to", "kubernetes", "--data", "corpus"],
     "--data: 'corpus' is relative, and the pods would resolve it"),
    (["--to", "torchrun", "--data", "nope"], "does not exist; pass a text file or a folder"),
    (["--to", "slurm", "--data", "a\nb"], "--data: got 'a\\nb'"),
])
def test_a_data_path_the_job_could_not_read_is_refused(tmp_path, monkeypatch, capsys, argv,
                                                       needle):
    _plan_beside_its_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert_refused(capsys, ["export", "plan.yaml", *argv], needle)


def _corpus(tmp_path: Path, case: str) -> str:
    path = tmp_path / case.removesuffix("/")
    if case.startswith("missing"):
        return str(path) + ("/" if case.endswith("/") else "")
    if case == "empty-folder":
        path.mkdir()
        return str(path)
    if case == "folder":
        (path / "sub").mkdir(parents=True)
        (path / "sub" / "a.txt").write_bytes(b"x" * 40)
        (path / "b.txt").write_bytes(b"y" * 40)
        return str(path)
    path.write_bytes(b"z" * (TINY.seq_len + (1 if case == "one-window" else 0)))
    return str(path)


@pytest.mark.parametrize("case", ["missing", "missing/", "empty-folder", "folder", "one-window",
                                  "too-short"])
def test_export_refuses_the_data_train_refuses(tmp_path, case):
    """The export's check (no torch, sizes only) and train's own (runtime.data, which reads
    the text) refuse every kind of path alike: one function (runtime.data_files.corpus_files)
    behind both; a path given with a trailing slash was quoted as given by one, as a Path by
    the other."""
    from autoplan.runtime.data import check_byte_vocab, scan_corpus

    path = _corpus(tmp_path, case)
    refusals = []
    for check in (lambda: check_data(path, TINY),
                  lambda: (check_byte_vocab(TINY.vocab_size), scan_corpus(path, TINY.seq_len))):
        try:
            check()
            refusals.append(None)
        except ConfigError as err:
            refusals.append((err.field, err.problem, err.fix))
    assert refusals[0] == refusals[1]
    assert (refusals[0] is None) == (case in ("folder", "one-window"))
    small = TINY.replace(vocab_size=128)
    with pytest.raises(ConfigError, match="vocab_size 128 < 256"):
        check_data(path, small)


@pytest.mark.parametrize("target", list(SCRIPTS))
@pytest.mark.parametrize("ref", ["mymodel"])
def test_a_path_load_plan_leaves_as_written_is_refused_saying_why(tmp_path, monkeypatch, capsys,
                                                                 target, ref):
    """A bare word that is no preset and no file in the plan's folder is the one path
    load_plan leaves relative (a '~' path it expands): every command reads it from the folder
    it runs in, so the job, started anywhere, may read another. The refusal said the job
    resolves it from the plan's folder, where it was 'missing', which neither export nor the
    job reads."""
    plan = _plan_beside_its_files(tmp_path / "runs", model=ref)
    here = tmp_path / "here"
    (here / ref).parent.mkdir(parents=True)
    (here / ref).write_text(dump_yaml(to_dict(TINY.replace(name="mine"))))
    monkeypatch.chdir(here)
    why = f"is no model preset and no file in the plan's folder {tmp_path / 'runs'}"
    err = assert_refused(capsys, ["export", str(plan), "--to", target],
                         f"model: {ref!r} {why}, so it stays as written and each command reads it "
                         f"from the folder it runs in: {here / ref} from here, but the exported "
                         "job reads it from whatever folder it is started in; write it in the "
                         f"plan as {here / ref} (absolute)")
    assert "missing" not in err
