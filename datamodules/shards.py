"""Pre-tokenized shards: flat token-id files read back as memory maps (the nanoGPT layout).

A shard directory:

    train.bin  val.bin  test.bin   raw little-endian uint16 (vocab <= 65535) or uint32 token ids
    meta.json                      dtype, vocab_size, tokenizer kind, token counts, corpus, fractions
    tokenizer.json | byte_tokenizer.json   the tokenizer that produced the ids

The split is contiguous and deterministic over the token stream:

    |<------------- train ------------->|<-- val -->|<-- test -->|
    0                                 n_train   n_train+n_val    N

meta.json is written last, so a directory without it is an unfinished write and is never read.
`prepare_text_shards` goes from a corpus to such a directory (CLI: `python -m datamodules.prepare_text`);
a BPE tokenizer is trained on the leading (training) fraction of the text only, so validation and
test text never shape the vocabulary.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from datamodules.text_corpus import load_corpus
from datamodules.tokenizers import (
    BPE_FILE,
    BYTE_FILE,
    ByteTokenizer,
    TextTokenizer,
    TokenizerKind,
    build_tokenizer,
    check_bpe_vocab_size,
    check_kind,
    load_tokenizer,
)

SPLITS: tuple[str, ...] = ("train", "val", "test")
META_FILE = "meta.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShardMeta:
    """The contents of meta.json.

    Attributes:
        dtype: "uint16" or "uint32", the on-disk id type.
        vocab_size: Size of the id space the model embeds (for BPE the requested size).
        tokenizer: Tokenizer kind, "byte" or "bpe".
        tokenizer_vocab_size: Tokens the saved tokenizer actually has (<= vocab_size).
        num_tokens: Tokens over all splits.
        split_tokens: Tokens per split.
        split_fractions: Fractions the split was made with.
        corpus: Corpus name ("bible-kjv", "pydoc-topics", a file stem).
        source: Where the text came from, for the record.
    """

    dtype: str
    vocab_size: int
    tokenizer: str
    tokenizer_vocab_size: int
    num_tokens: int
    split_tokens: dict[str, int]
    split_fractions: dict[str, float]
    corpus: str
    source: str
    format_version: int = FORMAT_VERSION


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Raises a one-line ValueError unless both fractions lie in (0, 1) and sum below 1."""
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name}={value} must lie strictly between 0 and 1")
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"val_fraction + test_fraction = {val_fraction + test_fraction} must be < 1 to leave training data"
        )


def shard_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65535), else uint32."""
    if not 0 < vocab_size <= 2**32 - 1:
        raise ValueError(f"vocab_size={vocab_size} must lie in [1, 2**32-1] to be stored as token shards")
    return np.dtype(np.uint16) if vocab_size <= 2**16 - 1 else np.dtype(np.uint32)


def split_bounds(num_tokens: int, val_fraction: float, test_fraction: float) -> dict[str, tuple[int, int]]:
    """Contiguous [start, stop) ranges per split: train first, then val, then test."""
    check_fractions(val_fraction, test_fraction)
    n_val = round(num_tokens * val_fraction)
    n_test = round(num_tokens * test_fraction)
    n_train = num_tokens - n_val - n_test
    return {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, num_tokens)}


def write_shards(
    tokens: np.ndarray,
    out_dir: str | Path,
    tokenizer: TextTokenizer,
    *,
    vocab_size: int,
    corpus: str,
    source: str,
    val_fraction: float,
    test_fraction: float,
) -> ShardMeta:
    """Splits a token stream and writes train/val/test.bin, the tokenizer and meta.json.

    Args:
        tokens: 1-D integer token ids of the whole corpus.
        out_dir: Created if missing; existing shards in it are overwritten.
        tokenizer: Saved beside the shards.
        vocab_size: The model's id space; every id must be below it.
        corpus: Corpus name for meta.json.
        source: Where the text came from, for meta.json.
        val_fraction: Fraction of tokens for validation.
        test_fraction: Fraction of tokens for test.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, more than vocab_size={vocab_size}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"token ids span [{tokens.min()}, {tokens.max()}], outside [0, vocab_size={vocab_size})")
    dtype = shard_dtype(vocab_size)
    out_dir = Path(out_dir)
    bounds = split_bounds(tokens.size, val_fraction, test_fraction)
    meta = ShardMeta(
        dtype=dtype.name,
        vocab_size=vocab_size,
        tokenizer=tokenizer.kind,
        tokenizer_vocab_size=tokenizer.vocab_size,
        num_tokens=int(tokens.size),
        split_tokens={split: stop - start for split, (start, stop) in bounds.items()},
        split_fractions={
            "train": round(1.0 - val_fraction - test_fraction, 12),
            "val": val_fraction,
            "test": test_fraction,
        },
        corpus=corpus,
        source=source,
    )
    # Everything is written into a private staging directory and moved in file by file (os.replace is
    # atomic), meta.json last. Two processes preparing the same cache entry at once (a parallel sweep on
    # a cold cache) then never expose a half-written file: a reader's open memory map keeps the file it
    # opened. Only a rewrite with other contents removes meta.json first, marking the set incomplete.
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))  # unique per writer, same file system
    try:
        for split, (start, stop) in bounds.items():
            tokens[start:stop].astype(dtype.newbyteorder("<")).tofile(staging / f"{split}.bin")
        tokenizer.save(staging)
        (staging / META_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n")
        if has_shards(out_dir) and (out_dir / META_FILE).read_text() != (staging / META_FILE).read_text():
            (out_dir / META_FILE).unlink()
        for stale in (BPE_FILE, BYTE_FILE):  # never leave another kind's tokenizer beside the ids
            if not (staging / stale).exists():
                (out_dir / stale).unlink(missing_ok=True)
        for path in sorted(staging.iterdir(), key=lambda p: p.name == META_FILE):  # meta.json last
            os.replace(path, out_dir / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta


def has_shards(directory: str | Path) -> bool:
    """True when `directory` holds a finished shard set (meta.json present)."""
    return (Path(directory) / META_FILE).is_file()


def read_meta(directory: str | Path) -> ShardMeta:
    """Reads meta.json with one-line errors for a missing or malformed file."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(directory)!r} holds no token shards: {META_FILE} is missing")
    try:
        raw = json.loads(path.read_text())
        return ShardMeta(**raw)
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{str(path)!r} is not a valid shard meta.json ({err})") from None


def open_shard(directory: str | Path, split: str, meta: ShardMeta | None = None) -> np.ndarray:
    """Memory-maps one split read-only; its length is checked against meta.json."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not a shard split; valid: {', '.join(SPLITS)}")
    meta = meta or read_meta(directory)
    path = Path(directory) / f"{split}.bin"
    if not path.is_file():
        raise FileNotFoundError(f"shard file {str(path)!r} is missing (meta.json lists it)")
    dtype = np.dtype(meta.dtype).newbyteorder("<")
    expected = meta.split_tokens[split]
    if path.stat().st_size != expected * dtype.itemsize:
        raise ValueError(
            f"shard file {str(path)!r} has {path.stat().st_size} bytes, meta.json expects "
            f"{expected} {meta.dtype} tokens ({expected * dtype.itemsize} bytes)"
        )
    if expected == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap refuses empty files
    return np.memmap(path, dtype=dtype, mode="r")


def load_shard_tokenizer(directory: str | Path, meta: ShardMeta | None = None) -> TextTokenizer:
    """Loads the tokenizer saved beside the shards and checks it against meta.json."""
    meta = meta or read_meta(directory)
    tokenizer = load_tokenizer(directory, meta.tokenizer)  # type: ignore[arg-type]
    if tokenizer.vocab_size != meta.tokenizer_vocab_size or tokenizer.vocab_size > meta.vocab_size:
        raise ValueError(
            f"tokenizer in {str(directory)!r} has {tokenizer.vocab_size} tokens but meta.json records "
            f"{meta.tokenizer_vocab_size} (vocab_size={meta.vocab_size}); re-run datamodules.prepare_text"
        )
    return tokenizer


def prepare_text_shards(
    source: str,
    out_dir: str | Path,
    tokenizer: TokenizerKind = "byte",
    vocab_size: int = 4096,
    val_fraction: float = 0.05,
    test_fraction: float = 0.05,
) -> ShardMeta:
    """Loads `source`, tokenizes it and writes shards plus tokenizer and meta.json to `out_dir`.

    Args:
        source: "embedded", a UTF-8 text file or a directory of .txt/.md files.
        out_dir: Shard directory to write.
        tokenizer: "byte" (vocab 256) or "bpe" (trained here).
        vocab_size: BPE vocabulary size; ignored for "byte".
        val_fraction: Fraction of tokens for validation.
        test_fraction: Fraction of tokens for test.

    Returns:
        The metadata written to meta.json.
    """
    check_kind(tokenizer)
    check_fractions(val_fraction, test_fraction)
    if tokenizer == "bpe":
        check_bpe_vocab_size(vocab_size)
    corpus = load_corpus(source)
    if tokenizer == "byte":
        tok = ByteTokenizer()
        vocab_size = tok.vocab_size
    else:
        train_chars = int(len(corpus.text) * (1.0 - val_fraction - test_fraction))
        tok = build_tokenizer("bpe", corpus.text[:train_chars], vocab_size=vocab_size)
    tokens = tok.encode_array(corpus.text)
    return write_shards(
        tokens,
        out_dir,
        tok,
        vocab_size=vocab_size,
        corpus=corpus.name,
        source=source if source == "embedded" else str(Path(source).resolve()),
        val_fraction=val_fraction,
        test_fraction=test_fraction,
    )
