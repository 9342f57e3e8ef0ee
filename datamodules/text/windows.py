"""Fixed-length token windows over a memory-mapped shard, and how they are chosen.

A window starting at s holds seq_len + 1 tokens; the model reads [:-1] and predicts [1:]:

    tokens   ... t[s] t[s+1] ... t[s+L-1] t[s+L] ...
    input        [---------- L ----------]
    target            [---------- L ----------]

Training reads either every non-overlapping window once per epoch in a seeded order
(`PermutedWindowSampler`, OLMo's order: one epoch = one pass over the split) or starts drawn uniformly with
replacement (`RandomWindowSampler`); both are reproducible per (seed, epoch) and resumable mid-epoch.
Evaluation uses a fixed set of evenly spaced, non-overlapping starts (`eval_window_starts`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from datamodules.samplers import ResumableSampler, compact, epoch_seed

__all__ = ["PermutedWindowSampler", "RandomWindowSampler", "TokenWindows", "epoch_seed", "eval_window_starts"]


class TokenWindows(Dataset[torch.Tensor]):
    """Windows of seq_len + 1 tokens from a flat token file; index = window start.

    The memory map is opened lazily in each process (never pickled), so worker processes
    share the page cache instead of copying the array.

    Args:
        path: A flat token file (e.g. train.bin).
        dtype: Its on-disk dtype ("uint16" or "uint32").
        seq_len: Model context length; each item has seq_len + 1 tokens.
    """

    def __init__(self, path: str | Path, dtype: str, seq_len: int) -> None:
        self.path = Path(path)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.seq_len = seq_len
        self.num_tokens = self.path.stat().st_size // self.dtype.itemsize
        self._tokens: np.ndarray | None = None
        if self.num_tokens < seq_len + 1:
            raise ValueError(
                f"{str(self.path)!r} holds {self.num_tokens} tokens, fewer than seq_len+1={seq_len + 1}; "
                "use a larger corpus, a larger split fraction or a smaller seq_len"
            )

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        return self._tokens

    def __len__(self) -> int:
        """Number of valid window starts."""
        return self.num_tokens - self.seq_len

    def __getitem__(self, start: int) -> torch.Tensor:
        if not 0 <= start < len(self):
            raise IndexError(f"window start {start} outside [0, {len(self)})")
        window = self.tokens[start : start + self.seq_len + 1]
        return torch.from_numpy(window.astype(np.int64))  # (seq_len + 1,)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tokens"] = None  # reopen in the worker rather than pickling the whole array
        return state


class RandomWindowSampler(ResumableSampler):
    """Yields `num_samples` window starts drawn uniformly (with replacement) from [0, num_starts).

    Reproducible per (seed, epoch) and resumable mid-epoch: see :mod:`datamodules.samplers`.

    Args:
        num_starts: Number of valid starts (len of the `TokenWindows`).
        num_samples: Starts per epoch.
        seed: Base seed.
    """

    def __init__(self, num_starts: int, num_samples: int, seed: int = 0) -> None:
        if num_starts <= 0:
            raise ValueError(f"num_starts={num_starts} must be positive")
        super().__init__(num_samples, seed)
        self.num_starts = num_starts

    def draw(self, generator: torch.Generator) -> np.ndarray:
        return compact(torch.randint(0, self.num_starts, (self.num_samples,), generator=generator))


class PermutedWindowSampler(ResumableSampler):
    """Every non-overlapping window of a split exactly once per epoch, in a seeded order (one epoch = one pass).

    Window k starts at ``k * (seq_len + 1)`` and holds tokens ``[k (L+1), (k+1)(L+1))``, so no two windows share a
    token (OLMo cuts its instances the same way: contiguous, disjoint chunks); the tail shorter than a window is not
    read. The epoch's order is a permutation of the ``num_tokens // (seq_len + 1)`` windows drawn from
    ``epoch_seed(seed, epoch)`` alone. Rank r of W takes items r, r + W, ... of that one global order
    (:func:`datamodules.samplers.shard_over_ranks`), as OLMo's ``IterableDataset`` slices its global indices
    (allenai/OLMo, olmo/data/iterable_dataset.py, ``_build_global_indices`` and ``__iter__``), so a mid-epoch resume
    at any world size continues with exactly the windows not yet read (:mod:`datamodules.samplers`).

    Args:
        num_tokens: Tokens in the split.
        seq_len: Model context length; each window holds seq_len + 1 tokens.
        seed: Base seed.
    """

    def __init__(self, num_tokens: int, seq_len: int, seed: int = 0) -> None:
        if seq_len <= 0:
            raise ValueError(f"seq_len={seq_len} must be positive")
        self.stride = seq_len + 1
        windows = num_tokens // self.stride
        if windows <= 0:
            raise ValueError(f"the split holds {num_tokens} tokens, fewer than one window of seq_len+1={self.stride}")
        super().__init__(windows, seed)

    def draw(self, generator: torch.Generator) -> np.ndarray:
        """The epoch's window order, held as window numbers (int32 below 2^31 windows: 195 MB for the 48.8 M
        windows of 100B tokens at seq_len 2,048); :meth:`items` turns each handed-out slice into starts."""
        dtype = torch.int32 if self.num_samples < 2**31 else torch.int64
        return compact(torch.randperm(self.num_samples, generator=generator, dtype=dtype))

    def items(self, drawn: np.ndarray) -> np.ndarray:
        return drawn.astype(np.int64) * self.stride  # int64: starts pass 2^31 beyond 2 GB of tokens


def eval_window_starts(num_tokens: int, seq_len: int, max_windows: int) -> np.ndarray:
    """Evenly spaced, non-overlapping window starts covering a split end to end.

    Uses min(max_windows, (num_tokens - 1) // seq_len) windows; the first starts at 0 and the
    last ends at the final token. Consecutive windows share at most their boundary token.
    """
    if num_tokens < seq_len + 1:
        raise ValueError(f"split holds {num_tokens} tokens, fewer than seq_len+1={seq_len + 1}")
    count = max(1, min(max_windows, (num_tokens - 1) // seq_len))
    last = num_tokens - seq_len - 1
    return np.round(np.linspace(0, last, count)).astype(np.int64)
