"""The checks a --data path passes before a token is read, in one place for both sides: `autoplan
train` (runtime/data.py, which reads and hashes the text) and `autoplan export`
(export/job_inputs.py, which only opens and sizes it). No torch here, so export can import it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autoplan.errors import ConfigError

BYTE_VOCAB = 256
"""Token ids byte-level text needs: one per byte value."""


def check_byte_vocab(vocab_size: int) -> None:
    """Byte-level text needs a token id for each of the 256 byte values."""
    if vocab_size < BYTE_VOCAB:
        raise ConfigError(
            "--data", f"the model's vocab_size {vocab_size} < 256", "byte-level text needs 256"
        )


def corpus_files(path: str | Path, seq_len: int,
                 size_of: Callable[[Path], int]) -> list[tuple[Path, int]]:
    """The files of the corpus at `path` in reading order (one file, or a folder's files, its
    subfolders searched, sorted), each with its size in bytes as `size_of` measures it (by
    reading it, or only opening it). Refused on --data as `autoplan train` refuses them: a
    path that is no file or folder of files, a file `size_of` cannot read (OSError), fewer
    bytes in all than one window of seq_len + 1 tokens."""
    sized = []
    for f in _text_files(Path(path)):
        try:
            sized.append((f, size_of(f)))
        except OSError as err:  # no permission, a device file, a file gone since it was listed
            raise ConfigError("--data", f"cannot read {str(f)!r} ({err.strerror or err})",
                              "fix its permissions or move it out of the data folder") from None
    total = sum(size for _, size in sized)
    if (total - 1) // seq_len < 1:
        raise ConfigError("--data", f"{str(path)!r} holds {total} bytes",
                          f"need at least {seq_len + 1} (one window of seq_len + 1 tokens)")
    return sized


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        if files:
            return files
        raise ConfigError("--data", f"the folder {str(path)!r} holds no files (its subfolders "
                          "searched too)", "put text files in it, or pass one text file")
    what = "is not a regular file or folder" if path.exists() else "does not exist"
    raise ConfigError("--data", f"{str(path)!r} {what}", "pass a text file or a folder of them")
