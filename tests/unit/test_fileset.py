"""autoplan.fileset: several files written as one result, whole or not at all, with what
--force replaced put back when a rename fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoplan import fileset
from autoplan.errors import ConfigError


def _full_at(call: int):
    """An os.fsync that fails with ENOSPC on its `call`-th call."""
    calls = {"n": 0}
    real = os.fsync

    def fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == call:
            raise OSError(28, "No space left on device")
        real(fd)

    return fsync


@pytest.mark.parametrize("force", [False, True])
def test_a_set_of_files_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch,
                                                       force: bool) -> None:
    a, b = tmp_path / "ds.json", tmp_path / "ds.launch.sh"
    if force:
        a.write_text("old a\n")
    monkeypatch.setattr(fileset.os, "fsync", _full_at(2))
    with pytest.raises(ConfigError, match="cannot write .*ds.launch.sh.*No space left.*wrote "
                                          "none of the files"):
        fileset.write_texts({a: "new a\n", b: "new b\n"}, force=force)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["ds.json"] if force else [])
    if force:
        assert a.read_text() == "old a\n"
    monkeypatch.undo()
    fileset.write_texts({a: "new a\n", b: "new b\n"}, force=force or False)
    assert (a.read_text(), b.read_text()) == ("new a\n", "new b\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json", "ds.launch.sh"]


def test_a_failed_rename_puts_back_what_force_replaced(tmp_path: Path, monkeypatch) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a\n")
    real = os.replace
    calls = {"n": 0}

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == 2 and Path(dst) == b:  # the second file's rename
            raise OSError(5, "Input/output error")
        real(src, dst)

    monkeypatch.setattr(fileset.os, "replace", replace)
    with pytest.raises(ConfigError, match="b.txt"):
        fileset.write_texts({a: "new a\n", b: "new b\n"}, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    assert a.read_text() == "old a\n"
