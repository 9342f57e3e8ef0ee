"""TextDataModule: causal-LM batches of fixed-length token windows from pre-tokenized shards.

    source ("embedded" | text file/dir | shard dir)
        --prepare_data-->  data_dir/<corpus>-<tokenizer><vocab>-<hash>/{train,val,test}.bin + meta.json
        --setup-------->   TokenWindows over each split (np.memmap)
        --dataloaders-->   LongTensor (B, seq_len + 1); the model uses [:, :-1] as input, [:, 1:] as target

Training windows are either every non-overlapping window once per epoch in a seeded order
(``sampling="permutation"``, `PermutedWindowSampler`: one epoch = one pass, OLMo's order) or random starts drawn
with replacement (``sampling="with_replacement"``, `RandomWindowSampler`, the default the tiny configs were
measured with); both are seeded by (seed, epoch) and resumable mid-epoch. Validation and test use a fixed set of
evenly spaced windows, so their loss is comparable across runs and schemes: ``eval_samples`` of them, or, inside
:meth:`TextDataModule.whole_val_split` (a fit's final validation, :mod:`experiments.monitoring.final_validation`),
every window that tiles the validation split, so each of its tokens but the first is predicted once.
"""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

import lightning as L
import numpy as np
import torch
from annotated_types import Ge, Interval
from torch.utils.data import DataLoader, Dataset, Subset

from datamodules.batching import check_global_batch, set_accumulation
from datamodules.fingerprint import check_same_files
from datamodules.loaders import make_loader
from datamodules.samplers import ResumableSampler
from datamodules.text.corpus import embedded_corpus_name
from datamodules.text.pipeline import prepare_text_shards
from datamodules.text.shard_windows import SplitWindows
from datamodules.text.shards import (
    FORMAT_VERSION,
    META_FILE,
    ShardMeta,
    check_fractions,
    has_shards,
    load_shard_tokenizer,
    open_split,
    read_meta,
)
from datamodules.text.tokenizers import ByteTokenizer, TextTokenizer, check_bpe_vocab_size, check_kind
from datamodules.text.windows import PermutedWindowSampler, RandomWindowSampler, TokenWindows, eval_window_starts
from fileio.checks import utf8_text

BASELINE_TOKENS = 1 << 24  # the baseline reads at most the first 16M training tokens: cheap on any corpus

__all__ = ["PermutedWindowSampler", "RandomWindowSampler", "TextDataModule"]

SAMPLINGS = ("permutation", "with_replacement")


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name}={value} must be a positive integer")


class TextDataModule(L.LightningDataModule):
    """Causal language-modeling data over an offline corpus.

    Args:
        source: "embedded" (KJV Bible, or pydoc topics when `bible` is absent), a UTF-8 text file,
            a directory of .txt/.md files, or a directory already holding shards and meta.json.
        data_dir: Where prepared shards are cached, one subdirectory per (source, tokenizer, split).
        tokenizer: "byte" (vocab 256) or "bpe" (byte-level BPE trained on the training text).
        bpe_vocab_size: BPE vocabulary size, also the model's vocab_size when tokenizer="bpe".
        seq_len: Context length; batches hold seq_len + 1 tokens per row.
        batch_size: Rows per batch on each device (the micro-batch).
        global_batch_size: Rows per optimizer step over all devices (the number a recipe states, e.g. OLMo-1B's
            2048), reached by accumulating global / (batch_size x data-parallel replicas) micro-batches, which
            must be whole (:mod:`datamodules.batching`); None steps after every micro-batch (the Trainer's own
            ``accumulate_grad_batches``).
        num_workers: DataLoader worker processes.
        val_fraction: Fraction of tokens (the part after train) used for validation.
        test_fraction: Fraction of tokens (the tail) used for test.
        sampling: How training windows are chosen: "permutation" reads every non-overlapping window of the
            training split once per epoch in a seeded order (one epoch = one pass over the data, as OLMo trains);
            "with_replacement" draws ``train_samples_per_epoch`` starts uniformly with replacement (so some text
            is read several times and some never).
        train_samples_per_epoch: Random windows per training epoch under ``sampling="with_replacement"`` (an
            "epoch" is this many rows); unused under "permutation", whose epoch is the whole split.
        eval_samples: Maximum number of fixed validation/test windows.
        seed: Seed of the training-window draw (combined with the epoch).
        prompts: texts ``predict`` continues; None uses the first ``prompt_len`` tokens of the
            first ``num_prompts`` test windows.
        num_prompts: how many test-window prompts when ``prompts`` is None.
        prompt_len: tokens per test-window prompt.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data/text",
        tokenizer: Literal["byte", "bpe"] = "byte",
        bpe_vocab_size: Annotated[int, Interval(ge=256, le=2**32 - 1)] = 4096,
        seq_len: Annotated[int, Ge(1)] = 128,
        batch_size: Annotated[int, Ge(1)] = 32,
        global_batch_size: Annotated[int, Ge(1)] | None = None,
        num_workers: Annotated[int, Ge(0)] = 0,
        val_fraction: Annotated[float, Interval(gt=0, lt=1)] = 0.05,
        test_fraction: Annotated[float, Interval(gt=0, lt=1)] = 0.05,
        sampling: Literal["permutation", "with_replacement"] = "with_replacement",
        train_samples_per_epoch: Annotated[int, Ge(1)] = 20000,
        eval_samples: Annotated[int, Ge(1)] = 256,
        seed: int = 1234,
        prompts: list[str] | None = None,
        num_prompts: Annotated[int, Ge(1)] = 4,
        prompt_len: Annotated[int, Ge(1)] = 32,
    ) -> None:
        super().__init__()
        check_kind(tokenizer)
        if tokenizer == "bpe":
            check_bpe_vocab_size(bpe_vocab_size)
        _positive("seq_len", seq_len)
        _positive("batch_size", batch_size)
        check_global_batch(global_batch_size, batch_size)
        _positive("train_samples_per_epoch", train_samples_per_epoch)
        _positive("eval_samples", eval_samples)
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        check_fractions(val_fraction, test_fraction)
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling={sampling!r} is not a window sampling; valid: {', '.join(SAMPLINGS)}")
        if sampling == "with_replacement" and train_samples_per_epoch < batch_size:
            raise ValueError(
                f"train_samples_per_epoch={train_samples_per_epoch} is below batch_size={batch_size}; "
                "an epoch would hold no full batch"
            )
        self.save_hyperparameters()
        self.source = source
        self.data_dir = Path(data_dir)
        self.tokenizer_kind = tokenizer
        self.bpe_vocab_size = bpe_vocab_size
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.sampling = sampling
        self.train_samples_per_epoch = train_samples_per_epoch
        self.eval_samples = eval_samples
        self.seed = seed
        for i, prompt in enumerate(prompts or []):  # undecodable command-line bytes arrive as lone surrogates
            utf8_text(prompt, f"data.init_args.prompts[{i}]")
        self.prompts, self.num_prompts, self.prompt_len = prompts, num_prompts, prompt_len

        self._is_shard_source = source != "embedded" and has_shards(source)
        self._meta: ShardMeta | None = None
        self._tokenizer: TextTokenizer | None = ByteTokenizer() if tokenizer == "byte" else None
        if self._is_shard_source:
            self._check_meta(read_meta(source))
        self.train_dataset: TokenWindows | None = None
        self.val_dataset: Subset[torch.Tensor] | None = None
        self.test_dataset: Subset[torch.Tensor] | None = None
        self.train_sampler: PermutedWindowSampler | RandomWindowSampler | None = None
        self._baseline_loss: float | None = None
        self.data_fingerprint: str | None = None  # set by setup() under several ranks
        self._whole_val = False  # inside whole_val_split(): validation reads every window of the split

    # ----------------------------------------------------------------------------------- properties

    @property
    def vocab_size(self) -> int:
        """Size of the model's token-id space (256 for bytes, bpe_vocab_size for BPE)."""
        return 256 if self.tokenizer_kind == "byte" else self.bpe_vocab_size

    @property
    def corpus_name(self) -> str:
        """Corpus name: "bible-kjv", "pydoc-topics", or the stem of the user's file/directory."""
        if self._meta is not None:
            return self._meta.corpus
        if self.source == "embedded":
            return embedded_corpus_name()
        if self._is_shard_source:
            return read_meta(self.source).corpus
        return Path(self.source).resolve().stem or "corpus"

    @property
    def baseline_loss(self) -> float | None:
        """Loss (nats/token) of the best predictor that ignores context: the unigram entropy of the training
        tokens (over the first ``BASELINE_TOKENS``). A model near it learned token frequencies, nothing more.
        None until the shards exist (``prepare_data``)."""
        if self._baseline_loss is None and has_shards(self.shard_dir):
            tokens = open_split(self.shard_dir, "train")[:BASELINE_TOKENS]
            meta = read_meta(self.shard_dir)
            counts = np.bincount(tokens, minlength=meta.vocab_size).astype(np.float64)
            p = counts[counts > 0] / counts.sum()
            self._baseline_loss = float(-(p * np.log(p)).sum())
        return self._baseline_loss

    @property
    def tokenizer(self) -> TextTokenizer:
        """The tokenizer behind the ids (encode prompts, decode samples)."""
        if self._tokenizer is None:
            if not has_shards(self.shard_dir):
                raise RuntimeError("tokenizer='bpe' is trained by prepare_data(); call prepare_data() first")
            self._tokenizer = load_shard_tokenizer(self.shard_dir)
        return self._tokenizer

    @property
    def shard_dir(self) -> Path:
        """The shard directory used: the source itself, or a cache entry under data_dir."""
        if self._is_shard_source:
            return Path(self.source)
        return self.data_dir / self._cache_key()

    def _cache_key(self) -> str:
        """Readable prefix plus a hash of everything that changes the shard contents."""
        name = embedded_corpus_name() if self.source == "embedded" else Path(self.source).resolve().stem
        origin = self.source if self.source == "embedded" else str(Path(self.source).resolve())
        keyed = [origin, name, self.tokenizer_kind, self.vocab_size, self.val_fraction, self.test_fraction]
        digest = hashlib.sha1(json.dumps(keyed + [FORMAT_VERSION]).encode()).hexdigest()[:10]
        return f"{_slug(name)}-{self.tokenizer_kind}{self.vocab_size}-{digest}"

    def _check_meta(self, meta: ShardMeta) -> None:
        """Refuses shards made with another tokenizer or vocab than this module is configured for."""
        if meta.tokenizer != self.tokenizer_kind or meta.vocab_size != self.vocab_size:
            wanted = "tokenizer=byte" if meta.tokenizer == "byte" else f"tokenizer=bpe bpe_vocab_size={meta.vocab_size}"
            raise ValueError(
                f"shards in {str(self.shard_dir)!r} were made with tokenizer={meta.tokenizer} "
                f"vocab_size={meta.vocab_size}, but the datamodule has tokenizer={self.tokenizer_kind} "
                f"vocab_size={self.vocab_size}; set {wanted}"
            )

    # ------------------------------------------------------------------------------------ lifecycle

    def prepare_data(self) -> None:
        """Tokenizes the source into shards once; an existing cache entry is reused as is."""
        if self._is_shard_source or has_shards(self.shard_dir):
            return
        prepare_text_shards(
            self.source,
            self.shard_dir,
            tokenizer=self.tokenizer_kind,
            vocab_size=self.bpe_vocab_size,
            val_fraction=self.val_fraction,
            test_fraction=self.test_fraction,
        )

    def setup(self, stage: str | None = None) -> None:
        """Sets the trainer's accumulation for ``global_batch_size`` (fit), opens the shards of the splits `stage`
        needs and fixes the evaluation windows. Under several ranks, checks first that every rank reads the same
        shards (:mod:`datamodules.fingerprint`)."""
        if stage in (None, "fit"):
            set_accumulation(self.global_batch_size, self.batch_size, self.trainer)
        directory = self.shard_dir
        self._meta = read_meta(directory)
        self._check_meta(self._meta)
        shards = {seg["file"] for split in self._meta.split_tokens for seg in self._meta.segments(split)}
        self.data_fingerprint = check_same_files(directory, [META_FILE, *shards], f"text shards {directory}")
        self._tokenizer = load_shard_tokenizer(directory, self._meta)
        if stage in (None, "fit"):
            self.train_dataset = SplitWindows(directory, "train", self.seq_len, self._meta)
            if self.sampling == "permutation":
                self.train_sampler = PermutedWindowSampler(self.train_dataset.num_tokens, self.seq_len, self.seed)
            else:
                self.train_sampler = RandomWindowSampler(
                    len(self.train_dataset), self.train_samples_per_epoch, self.seed
                )
        if stage in (None, "fit", "validate"):
            self.val_dataset = self._eval_windows(directory, "val")
        if stage in (None, "test", "predict"):
            self.test_dataset = self._eval_windows(directory, "test")

    def _eval_windows(self, directory: Path, split: str) -> Subset[torch.Tensor]:
        windows = SplitWindows(directory, split, self.seq_len, self._meta)
        whole = split == "val" and self._whole_val
        limit = windows.num_tokens if whole else self.eval_samples  # (the windows that fit are fewer)
        starts = eval_window_starts(windows.num_tokens, self.seq_len, limit)
        return Subset(windows, starts.tolist())

    @contextmanager
    def whole_val_split(self) -> Iterator[None]:
        """Inside it, ``setup("validate")`` makes the validation set every window tiling the split, not the
        ``eval_samples`` evenly spaced ones: ``(tokens - 1) // seq_len`` windows whose targets cover each token of
        the split but the first (and the remainder of that division) exactly once. The windows of every other
        validation are restored after it."""
        previous, self._whole_val = self.val_dataset, True
        try:
            yield
        finally:
            self._whole_val, self.val_dataset = False, previous

    # ---------------------------------------------------------------------------------- dataloaders

    def _loader(self, dataset: Dataset, train_sampler: ResumableSampler | None = None) -> DataLoader:
        return make_loader(dataset, self.batch_size, train_sampler=train_sampler, trainer=self.trainer,
                           num_workers=self.num_workers)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None or self.train_sampler is None:
            raise RuntimeError("call setup('fit') before train_dataloader()")
        return self._loader(self.train_dataset, self.train_sampler)

    def val_dataloader(self) -> DataLoader:
        if self.val_dataset is None:
            raise RuntimeError("call setup('fit') or setup('validate') before val_dataloader()")
        return self._loader(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        if self.test_dataset is None:
            raise RuntimeError("call setup('test') before test_dataloader()")
        return self._loader(self.test_dataset)

    def predict_dataloader(self) -> DataLoader:
        """Prompts as token ids ``(1, N)``, one per batch: the given texts or test-window openings."""
        if self.test_dataset is None:
            raise RuntimeError("call setup('predict') before predict_dataloader()")
        if self.prompts:
            ids = [torch.tensor(self.tokenizer.encode(p), dtype=torch.long) for p in self.prompts]
            if any(len(i) == 0 for i in ids):
                raise ValueError("an empty prompt in data.prompts; give at least one character")
        else:
            n = min(self.num_prompts, len(self.test_dataset))
            ids = [self.test_dataset[i][: self.prompt_len] for i in range(n)]
        return DataLoader(ids, batch_size=1, shuffle=False)


def _slug(name: str) -> str:
    """A filesystem-safe, readable name fragment."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:40] or "corpus"
