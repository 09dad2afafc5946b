"""Training data: synthetic token sequences or local text under a byte-level tokenizer.

Sample k of a source is a pure function of (seed, k), so the batch of any step on any dp rank is
known without reading earlier ones: step t (1-based) uses global samples
[(t-1)*B, t*B), dp rank r the contiguous slice [r*B/dp, (r+1)*B/dp) of them. Resuming at step t
therefore continues at the exact sample, and every layout sees the same global batch. That holds
only for the same B, data and seed: checkpoints record them (the data as its path, its files with
their sizes and their SHA-256; and the samples consumed, t*B) and a resume with others is refused
(checkpoint_compat.check_settings), rather than re-indexed.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Protocol

import torch

from autoplan.runtime.data_files import check_byte_vocab, corpus_files

log = logging.getLogger(__name__)


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
    windows are visited in a seeded permutation per epoch. The bytes stay uint8 (one byte per
    token in memory, not eight); a sample is widened to int64 when it is taken."""

    def __init__(self, path: str | Path, seq_len: int, seed: int = 0) -> None:
        self.seq_len, self.seed = seq_len, seed
        digest, chunks = hashlib.sha256(), []

        def take(f: Path) -> int:  # hashed as read: the fingerprint costs no second pass
            chunk = f.read_bytes()
            digest.update(chunk)
            chunks.append(chunk)
            return len(chunk)

        files = corpus_files(path, seq_len, take)  # refuses less than one window
        data = bytearray().join(chunks)
        chunks.clear()  # one copy of the corpus in memory, not two
        self.fingerprint = _fingerprint(Path(path), files, digest)
        self.num_windows = (len(data) - 1) // seq_len
        self.tokens = torch.frombuffer(data, dtype=torch.uint8)
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
        return self.tokens[start : start + self.seq_len + 1].to(torch.int64)


_CHUNK = 1 << 20


def scan_corpus(path: str | Path, seq_len: int) -> dict:
    """What ByteText(path, seq_len) would check and fingerprint, read in 1 MiB chunks (the
    launcher's early check holds no copy of the corpus)."""
    digest = hashlib.sha256()

    def hashed(f: Path) -> int:
        size = 0
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return size

    return _fingerprint(Path(path), corpus_files(path, seq_len, hashed), digest)


def _fingerprint(root: Path, files: list[tuple[Path, int]], digest) -> dict:
    """What a checkpoint records of the corpus (checkpoint_compat.RunSettings.data_fingerprint):
    every file in reading order with its size, and the SHA-256 of their bytes in that order."""
    listing = [[f.name if f == root else f.relative_to(root).as_posix(), size]
               for f, size in files]
    return {"files": listing, "bytes": sum(size for _, size in files),
            "sha256": digest.hexdigest()}


def make_source(data: str | None, vocab_size: int, seq_len: int, seed: int) -> TokenSource:
    if data is None:
        return SyntheticTokens(vocab_size, seq_len, seed)
    check_byte_vocab(vocab_size)
    return ByteText(data, seq_len, seed)


def local_batch(
    source: TokenSource, step: int, global_batch: int, dp: int, dp_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of shape (global_batch/dp, seq_len) for 1-based `step` on `dp_rank`."""
    per_rank = global_batch // dp
    first = (step - 1) * global_batch + dp_rank * per_rank
    rows = torch.stack([source.sample(first + j) for j in range(per_rank)])
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
