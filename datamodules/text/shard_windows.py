"""Token windows over a split's shard files (:class:`~datamodules.text.shards.SplitTokens`), checked id by id.

Apart from :mod:`datamodules.text.shards` so that preparing shards never imports torch or Lightning.
"""

from __future__ import annotations

from pathlib import Path

import torch

from datamodules.text.shards import ShardMeta, SplitTokens, open_split, read_meta
from datamodules.text.windows import TokenWindows


class SplitWindows(TokenWindows):
    """:class:`~datamodules.text.windows.TokenWindows` over a split's shard files; every window's ids are checked
    against the vocabulary, so a corrupt shard is a one-line error naming it instead of an index error deep
    in the embedding."""

    def __init__(self, directory: str | Path, split: str, seq_len: int, meta: ShardMeta | None = None) -> None:
        meta = meta or read_meta(directory)
        self.split_tokens = open_split(directory, split, meta)
        self.path, self.dtype, self.seq_len = Path(directory), self.split_tokens.dtype, seq_len
        self.num_tokens, self.vocab_size, self._tokens = len(self.split_tokens), meta.vocab_size, None
        if self.num_tokens < seq_len + 1:
            raise ValueError(
                f"the {split} split of {str(directory)!r} holds {self.num_tokens} tokens, fewer than "
                f"seq_len+1={seq_len + 1}; use a larger corpus, a larger split fraction or a smaller seq_len"
            )

    @property
    def tokens(self) -> SplitTokens:
        return self.split_tokens

    def __getitem__(self, start: int) -> torch.Tensor:
        window = super().__getitem__(start)
        if int(window.max()) >= self.vocab_size:
            raise ValueError(
                f"token id {int(window.max())} in the {self.split_tokens.split} split of {str(self.path)!r} "
                f"(window at {start}) is beyond vocab_size={self.vocab_size}; the shards are corrupt or "
                "were made for another vocabulary"
            )
        return window

    def __getstate__(self) -> dict:
        return self.__dict__.copy()  # SplitTokens drops its own memory maps
