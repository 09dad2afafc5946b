"""autoplan.fsutil: atomic files and directories, the output lock, refusals before any work,
and modes that follow the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoplan import fsutil
from autoplan.errors import ConfigError


@pytest.fixture
def mask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.parametrize("umask,want", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_file_follows_the_umask(tmp_path: Path, umask: int, want: int) -> None:
    old = os.umask(umask)
    try:
        p = fsutil.write_text(tmp_path / "a.yaml", "x: 1\n")
    finally:
        os.umask(old)
    assert mode(p) == want and p.read_text() == "x: 1\n"


def test_existing_file_needs_force_and_no_temp_is_left(tmp_path: Path, mask: None) -> None:
    p = fsutil.write_text(tmp_path / "a", "one")
    with pytest.raises(ConfigError, match="already exists.*--force"):
        fsutil.write_text(p, "two")
    assert p.read_text() == "one"
    fsutil.write_text(p, "two", force=True)
    assert p.read_text() == "two" and sorted(x.name for x in tmp_path.iterdir()) == ["a"]


def test_file_targets_refused_before_any_write(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    (tmp_path / "adir").mkdir()
    with pytest.raises(ConfigError, match="which is a file"):
        fsutil.check_file_target(afile / "x" / "y.yaml", force=False, field="--out")
    with pytest.raises(ConfigError, match="is a directory"):
        fsutil.write_text(tmp_path / "adir", "x", force=True)
    assert list((tmp_path / "adir").iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory permissions")
def test_unwritable_directory_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(ConfigError, match="permission denied"):
        fsutil.check_dir_target(ro / "out", force=False, names=("a",), field="--out")


def test_atomic_dir_is_whole_or_absent(tmp_path: Path, mask: None) -> None:
    out = tmp_path / "deep" / "res"
    with pytest.raises(RuntimeError), fsutil.atomic_dir(out, force=False, names=("a", "b")) as d:
        (d / "a").write_text("1")
        raise RuntimeError("killed halfway")
    assert not (tmp_path / "deep").exists()  # nor the parent it made
    with fsutil.atomic_dir(out, force=False, names=("a", "b")) as d:
        (d / "a").write_text("1")
        (d / "b").write_text("2")
    assert sorted(x.name for x in out.iterdir()) == ["a", "b"] and mode(out) == 0o755
    assert sorted(x.name for x in out.parent.iterdir()) == ["res"]


def test_atomic_dir_replaces_an_old_result_and_keeps_foreign_files(tmp_path: Path) -> None:
    out = tmp_path / "res"
    with fsutil.atomic_dir(out, force=False, names=("a", "b")) as d:
        (d / "a").write_text("old")
        (d / "b").write_text("old")
    with pytest.raises(ConfigError, match="already holds a, b"):
        with fsutil.atomic_dir(out, force=False, names=("a", "b")):
            pass
    with fsutil.atomic_dir(out, force=True, names=("a", "b")) as d:
        (d / "a").write_text("new")
    assert sorted(x.name for x in out.iterdir()) == ["a"] and (out / "a").read_text() == "new"
    (out / "notes.txt").write_text("mine")
    with fsutil.atomic_dir(out, force=True, names=("a", "b")) as d:
        (d / "b").write_text("newer")
    assert (out / "notes.txt").read_text() == "mine" and (out / "b").read_text() == "newer"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["res"]


def test_second_lock_on_one_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "res"
    with fsutil.output_lock(out) as lock:
        assert lock.exists()
        with pytest.raises(ConfigError, match="another autoplan is writing"):
            with fsutil.output_lock(out):
                pass
    assert not lock.exists()
    with fsutil.output_lock(out):  # free again
        pass


def test_out_dot_and_a_folder_whose_parent_is_read_only(tmp_path: Path, monkeypatch) -> None:
    """`--out .` names the folder itself; when only the folder (not its parent) can be
    written, the files are staged inside it and replaced one by one."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    with fsutil.output_lock("."), fsutil.atomic_dir(".", force=False, names=("a",)) as d:
        assert d.parent == tmp_path
        (d / "a").write_text("1")
    assert sorted(x.name for x in work.iterdir()) == ["a", "notes.txt"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["work"]
    monkeypatch.setattr(fsutil, "_writable", lambda folder: folder != tmp_path)
    with fsutil.output_lock(work) as lock, \
            fsutil.atomic_dir(work, force=True, names=("a",)) as d:
        assert lock.parent == work and d.parent == work
        (d / "a").write_text("2")
    assert sorted(x.name for x in work.iterdir()) == ["a", "notes.txt"]
    assert (work / "a").read_text() == "2"


@pytest.mark.parametrize("where", [".", "absolute"])
def test_the_working_folder_is_filled_not_replaced(tmp_path: Path, monkeypatch,
                                                   where: str) -> None:
    """`search --out .` in an empty folder renamed a new folder over it: the shell was left in
    a deleted folder ("getcwd: cannot access parent directories"). A folder that is or holds
    the working directory keeps its identity (inode), empty or holding an earlier result."""
    outer = tmp_path / "outer"
    work = outer / "empty"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    inode = work.stat().st_ino
    for force in (False, True):
        if force:  # an earlier result, which force replaces
            assert sorted(x.name for x in work.iterdir()) == ["a"]
        with fsutil.atomic_dir("." if where == "." else str(work), force=force,
                               names=("a",)) as d:
            (d / "a").write_text(str(force))
        assert work.stat().st_ino == inode and Path.cwd().exists()
        assert (work / "a").read_text() == str(force)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["outer"]  # no staging left


def test_a_mount_point_is_staged_inside_and_filled(tmp_path: Path, monkeypatch) -> None:
    """A mount point was staged in its parent, another file system: os.replace failed with
    EXDEV (before: the rename over it failed with EBUSY), a traceback either way."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == mount or real(p))
    inode = mount.stat().st_ino
    with fsutil.atomic_dir(mount, force=False, names=("a",)) as d:
        assert d.parent == mount
        (d / "a").write_text("1")
    assert mount.stat().st_ino == inode and sorted(x.name for x in mount.iterdir()) == ["a"]


def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path) -> None:
    # the CLI fuzzer's case: --out of 300 characters raised ENAMETOOLONG from Path.is_dir
    import pytest

    from autoplan import fsutil
    from autoplan.errors import ConfigError

    with pytest.raises(ConfigError, match="--out"):
        fsutil.check_file_target(tmp_path / ("x" * 300), force=False)


def test_yaml_writes_follow_the_umask(tmp_path) -> None:
    # issue #14 item 16: profile, calibrate and plan saves went through mkstemp's 0600
    import os

    from autoplan.yaml_io import write_text_atomic

    old = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "p.yaml", "a: 1\n")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_folder_that_cannot_be_made_is_one_config_error() -> None:
    # root may write in /proc by access(), yet nothing can be made there
    with pytest.raises(ConfigError, match="--out: cannot create the directory"):
        fsutil.make_parents(Path("/proc/autoplan-no-such/sub"))
    with pytest.raises(ConfigError, match="--out: cannot create anything in '/proc'"):
        fsutil.check_file_target("/proc/autoplan-no-such/x.yaml", force=False)


def test_a_failed_write_is_one_config_error_and_leaves_nothing(tmp_path: Path,
                                                              monkeypatch) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "fsync", full)
    with pytest.raises(ConfigError, match="--out: cannot write .*No space left"):
        fsutil.write_text(tmp_path / "new" / "a.yaml", "x: 1\n")
    assert list(tmp_path.iterdir()) == []  # no temporary file, no folder made for it
