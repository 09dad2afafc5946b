"""Training data: synthetic token sequences or local text under a byte-level tokenizer.

Sample k of a source is a pure function of (seed, k), so the batch of any step on any dp rank is
known without reading earlier ones: step t (1-based) uses global samples
[(t-1)*B, t*B), dp rank r the contiguous slice [r*B/dp, (r+1)*B/dp) of them. Resuming at step t
therefore continues at the exact sample, and every layout sees the same global batch. That holds
only for the same B, data and seed: checkpoints record them (and the samples consumed, t*B) and a
resume with others is refused (checkpoint_compat.check_settings), rather than re-indexed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import torch

from autoplan.errors import ConfigError

log = logging.getLogger(__name__)

BYTE_VOCAB = 256


class TokenSource(Protocol):
    seq_len: int

    def sample(self, index: int) -> torch.Tensor:
        """Token ids of shape (seq_len + 1,), int64."""
        ...


class SyntheticTokens:
    """Learnable synthetic sequences: x[t+1] = (x[t] + stride) mod V with a random start and a
    random stride per sample (so the loss falls below log V as a model learns the rule)."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int = 0) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start, stride = torch.randint(0, self.vocab_size, (2,), generator=gen).tolist()
        stride = stride % 7 + 1
        steps = torch.arange(self.seq_len + 1, dtype=torch.int64)
        return (start + stride * steps) % self.vocab_size


class ByteText:
    """Bytes of local text files as tokens (vocab 256), packed into windows of seq_len + 1;
    windows are visited in a seeded permutation per epoch."""

    def __init__(self, path: str | Path, seq_len: int, seed: int = 0) -> None:
        self.seq_len, self.seed = seq_len, seed
        files = _text_files(Path(path))
        data = b"".join(_read(f) for f in files)
        self.num_windows = (len(data) - 1) // seq_len
        if self.num_windows < 1:  # before frombuffer, which refuses an empty buffer
            raise ConfigError(
                "--data", f"{path} holds {len(data)} bytes", f"need more than {seq_len + 1}"
            )
        self.tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
        self._perms: dict[int, torch.Tensor] = {}
        log.info("data: %d bytes from %d file(s), %d windows", len(data), len(files),
                 self.num_windows)

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(self.num_windows, generator=gen)}
        return self._perms[epoch]

    def sample(self, index: int) -> torch.Tensor:
        epoch, pos = divmod(index, self.num_windows)
        start = int(self._perm(epoch)[pos]) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:  # no permission, a device file, a file gone since it was listed
        raise ConfigError("--data", f"cannot read {path} ({err.strerror or err})",
                          "fix its permissions or move it out of the data folder") from None


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        if files:
            return files
    raise ConfigError("--data", f"no text files at {str(path)!r}", "pass a file or a directory")


def make_source(data: str | None, vocab_size: int, seq_len: int, seed: int) -> TokenSource:
    if data is None:
        return SyntheticTokens(vocab_size, seq_len, seed)
    if vocab_size < BYTE_VOCAB:
        raise ConfigError(
            "--data", f"the model's vocab_size {vocab_size} < 256", "byte-level text needs 256"
        )
    return ByteText(data, seq_len, seed)


def local_batch(
    source: TokenSource, step: int, global_batch: int, dp: int, dp_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of shape (global_batch/dp, seq_len) for 1-based `step` on `dp_rank`."""
    per_rank = global_batch // dp
    first = (step - 1) * global_batch + dp_rank * per_rank
    rows = torch.stack([source.sample(first + j) for j in range(per_rank)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
