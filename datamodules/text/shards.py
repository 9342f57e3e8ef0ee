"""Pre-tokenized shards: flat token-id files of a bounded size, read back as memory maps, and their manifest.

A shard directory:

    train-00000.bin ...  val-00000.bin  test-00000.bin   raw little-endian uint16 (vocab <= 65535) or uint32 ids
    meta.json                                            the manifest: dtype, vocabulary, tokenizer and its hash,
                                                         per split its files (file, offset, tokens), documents
                                                         and tokens, the inputs, the end-of-document id
    tokenizer.json | byte_tokenizer.json                 the tokenizer that produced the ids

Documents are split by a hash of their text (``split_by: document``); a corpus that is a single document (the
embedded Bible, one text file) is split by tokens instead (``split_by: tokens``, one ``tokens-*.bin`` stream):

    |<------------- train ------------->|<-- val -->|<-- test -->|
    0                                 n_train   n_train+n_val    N

meta.json is written last, so a directory without it is an unfinished write and is never read. Reading checks
every file against the manifest (a file of odd byte length or another size is named in one line) and every
window against the vocabulary. Directories of the first format (``train.bin`` ...) still load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from datamodules.text.tokenizers import BPE_FILE, BYTE_FILE, TextTokenizer, load_tokenizer
from fileio import InputError, read_json

SPLITS: tuple[str, ...] = ("train", "val", "test")
META_FILE = "meta.json"
FORMAT_VERSION = 2
SHARD_TOKENS = 100_000_000  # tokens per shard file: 200 MB of uint16


@dataclass(frozen=True)
class ShardMeta:
    """The contents of meta.json.

    Attributes:
        dtype: "uint16" or "uint32", the on-disk id type.
        vocab_size: Size of the id space the model embeds (>= the tokenizer's own size).
        tokenizer: Tokenizer kind, "byte" or "bpe" (any tokenizer.json).
        tokenizer_vocab_size: Tokens the saved tokenizer actually has (<= vocab_size).
        num_tokens: Tokens over all splits.
        split_tokens: Tokens per split.
        split_fractions: Fractions the split was made with.
        corpus: Corpus name ("bible-kjv", "pydoc-topics", a file stem).
        source: Where the text came from, for the record.
        format_version: 1 (one ``<split>.bin`` per split) or 2 (this layout).
        split_by: "document" (by the hash of each document) or "tokens" (one document, cut by token counts).
        files: per split, the ``{"file", "offset", "tokens"}`` segments holding it, in order.
        split_documents: documents per split (split_by tokens: 1 each, the parts of the one document).
        tokenizer_sha256: hash of the saved tokenizer file.
        eod_id: the end-of-document id written after every document (None: a single document).
        max_token_id: the largest id in the shards.
        inputs: the input files with their sizes and documents.
        spec_sha256: hash of everything the preparation was asked (inputs with sizes and times, tokenizer,
            fractions, ...): the same command finds its own finished set by it.
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
    split_by: str = "tokens"
    files: dict[str, list[dict]] = field(default_factory=dict)
    split_documents: dict[str, int] = field(default_factory=dict)
    tokenizer_sha256: str | None = None
    eod_id: int | None = None
    max_token_id: int | None = None
    inputs: list[dict] = field(default_factory=list)
    spec_sha256: str | None = None

    def segments(self, split: str) -> list[dict]:
        """The files holding ``split`` (a first-format directory: its one ``<split>.bin``)."""
        if self.format_version < 2 or not self.files:
            return [{"file": f"{split}.bin", "offset": 0, "tokens": self.split_tokens[split]}]
        return self.files[split]


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


def split_of_key(key: int, val_fraction: float, test_fraction: float) -> int:
    """0 (train), 1 (val) or 2 (test) for a document's 64-bit key: the key's place in [0, 1)."""
    u = key / 2.0**64
    return 2 if u < test_fraction else 1 if u < test_fraction + val_fraction else 0


#################################################################################
#                                   Writing                                     #
#################################################################################


class ShardWriter:
    """Appends token ids to ``<prefix>-00000.bin``, ``<prefix>-00001.bin``, ... of at most ``shard_tokens`` each.

    Its :meth:`state` is what a resumed preparation needs to continue byte for byte: the files so far and
    their lengths; :meth:`restore` truncates the files to that state and removes any written after it.
    """

    def __init__(self, directory: Path, prefix: str, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS) -> None:
        if shard_tokens < 1:
            raise ValueError(f"shard_tokens={shard_tokens} must be >= 1")
        self.directory, self.prefix, self.shard_tokens = directory, prefix, shard_tokens
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.files: list[list] = []  # [name, tokens]
        self.max_id = -1
        self._fh = None

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.files)

    def append(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids)
        if ids.size:
            self.max_id = max(self.max_id, int(ids.max()))
            if self.max_id > np.iinfo(self.dtype).max:  # astype would wrap it (70000 -> 4464 in uint16)
                raise ValueError(
                    f"token id {self.max_id} does not fit the shards' {self.dtype.name}; valid: a vocab_size above it"
                )
        ids = ids.astype(self.dtype, copy=False)
        while ids.size:
            if not self.files or self.files[-1][1] >= self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.files[-1][1]
            head, ids = ids[:room], ids[room:]
            self._fh.write(head.tobytes())
            self.files[-1][1] += int(head.size)

    def _open_next(self) -> None:
        if self._fh is not None:
            self._fh.close()
        name = f"{self.prefix}-{len(self.files):05d}.bin"
        self.files.append([name, 0])
        self._fh = open(self.directory / name, "wb")  # noqa: SIM115 - kept open across appends, closed in close()

    def sync(self) -> None:
        """Flushes to disk, so a state recorded now describes bytes that survive a crash."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def state(self) -> dict:
        return {"files": [list(f) for f in self.files], "max_id": self.max_id}

    def restore(self, state: dict) -> None:
        """Continues from ``state``: files truncated to their recorded lengths, later files removed."""
        self.files, self.max_id = [list(f) for f in state["files"]], state["max_id"]
        names = {name for name, _ in self.files}
        for path in self.directory.glob(f"{self.prefix}-*.bin"):
            if path.name not in names:
                path.unlink()
        for name, tokens in self.files:
            with open(self.directory / name, "r+b" if (self.directory / name).exists() else "wb") as fh:
                fh.truncate(tokens * self.dtype.itemsize)
        if self.files:
            self._fh = open(self.directory / self.files[-1][0], "ab")  # noqa: SIM115

    def close(self) -> None:
        self.sync()
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def segments(self) -> list[dict]:
        return [{"file": name, "offset": 0, "tokens": tokens} for name, tokens in self.files]


def cut_segments(files: list[list], start: int, stop: int) -> list[dict]:
    """The [start, stop) token range of a stream stored in ``files`` ([name, tokens] each) as segments."""
    out, position = [], 0
    for name, tokens in files:
        lo, hi = max(start, position), min(stop, position + tokens)
        if lo < hi:
            out.append({"file": name, "offset": lo - position, "tokens": hi - lo})
        position += tokens
    return out


def publish(staging: Path, out_dir: Path) -> None:
    """Moves a finished shard set from ``staging`` into ``out_dir``, meta.json last.

    A reader never sees a partial set: a rewrite with other contents first removes meta.json (marking the set
    incomplete), an identical rewrite keeps it. Readers' open memory maps keep the files they opened
    (``os.replace``). Stale files of the old set (shards, a tokenizer of another kind) are removed; no other
    file of ``out_dir`` is touched.
    """
    new_meta = (staging / META_FILE).read_text()
    old_files: set[str] = set()
    if has_shards(out_dir):
        old = read_meta(out_dir)
        old_files = {seg["file"] for split in SPLITS for seg in old.segments(split)} | {BPE_FILE, BYTE_FILE}
        if (out_dir / META_FILE).read_text() != new_meta:
            (out_dir / META_FILE).unlink()
    new_files = {p.name for p in staging.iterdir()}
    for stale in old_files - new_files:
        (out_dir / stale).unlink(missing_ok=True)
    for path in sorted(staging.iterdir(), key=lambda p: p.name == META_FILE):  # meta.json last
        if path.is_file():
            os.replace(path, out_dir / path.name)


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
    shard_tokens: int = SHARD_TOKENS,
) -> ShardMeta:
    """Writes one document's token stream split by tokens (train | val | test), its tokenizer and meta.json.

    Args:
        tokens: 1-D integer token ids of the whole corpus.
        out_dir: Created if missing; a previous set in it is replaced (see :func:`publish`).
        tokenizer: Saved beside the shards.
        vocab_size: The model's id space; every id must be below it.
        corpus: Corpus name for meta.json.
        source: Where the text came from, for meta.json.
        val_fraction: Fraction of tokens for validation.
        test_fraction: Fraction of tokens for test.
        shard_tokens: Tokens per file at most.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, more than vocab_size={vocab_size}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"token ids span [{tokens.min()}, {tokens.max()}], outside [0, vocab_size={vocab_size})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir))  # unique per writer, same file system
    try:
        writer = ShardWriter(staging, "tokens", shard_dtype(vocab_size), shard_tokens)
        writer.append(tokens)
        writer.close()
        tokenizer.save(staging)
        meta = token_split_meta(writer, tokenizer, staging, vocab_size, corpus, source, val_fraction, test_fraction)
        (staging / META_FILE).write_text(json.dumps(asdict(meta), indent=2) + "\n")
        publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta


def token_split_meta(
    writer: ShardWriter,
    tokenizer: TextTokenizer,
    tokenizer_dir: Path,
    vocab_size: int,
    corpus: str,
    source: str,
    val_fraction: float,
    test_fraction: float,
    **extra,
) -> ShardMeta:
    """The manifest of a single document's stream cut by token counts into train | val | test."""
    bounds = split_bounds(writer.tokens, val_fraction, test_fraction)
    return ShardMeta(
        dtype=shard_dtype(vocab_size).name,
        vocab_size=vocab_size,
        tokenizer=tokenizer.kind,
        tokenizer_vocab_size=tokenizer.vocab_size,
        num_tokens=writer.tokens,
        split_tokens={s: hi - lo for s, (lo, hi) in bounds.items()},
        split_fractions=fractions(val_fraction, test_fraction),
        corpus=corpus,
        source=source,
        split_by="tokens",
        files={s: cut_segments(writer.files, lo, hi) for s, (lo, hi) in bounds.items()},
        split_documents=dict.fromkeys(SPLITS, 1),  # the parts of the one document
        tokenizer_sha256=tokenizer_hash(tokenizer_dir, tokenizer.kind),
        max_token_id=writer.max_id if writer.max_id >= 0 else None,
        **extra,
    )


def fractions(val_fraction: float, test_fraction: float) -> dict[str, float]:
    return {"train": round(1.0 - val_fraction - test_fraction, 12), "val": val_fraction, "test": test_fraction}


def tokenizer_hash(directory: Path, kind: str) -> str:
    import hashlib

    return hashlib.sha256((directory / (BYTE_FILE if kind == "byte" else BPE_FILE)).read_bytes()).hexdigest()


#################################################################################
#                                   Reading                                     #
#################################################################################


def has_shards(directory: str | Path) -> bool:
    """True when `directory` holds a finished shard set (meta.json present)."""
    return (Path(directory) / META_FILE).is_file()


def read_meta(directory: str | Path) -> ShardMeta:
    """Reads meta.json with one-line errors for a missing or malformed file."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{str(directory)!r} holds no token shards: {META_FILE} is missing")
    try:
        meta = ShardMeta(**read_json(path, "shard meta", dict))
    except (InputError, TypeError) as err:  # not JSON, an array, too deep; or keys of another format
        raise ValueError(f"{str(path)!r} is not a valid shard meta.json ({str(err).splitlines()[0]})") from None
    for split in SPLITS:
        for seg in meta.segments(split) if split in meta.split_tokens else []:
            if Path(seg["file"]).name != seg["file"] or seg["file"].startswith("."):
                raise ValueError(f"{str(path)!r} names the shard file {seg['file']!r}; valid: a file beside it")
    return meta


class SplitTokens:
    """One split's tokens over its shard files, indexable like a 1-D array (slices read across files).

    The memory maps open lazily in each process and are never pickled, so DataLoader workers share the page
    cache. Every file's size is checked against the manifest when the split is opened.
    """

    def __init__(self, directory: str | Path, split: str, meta: ShardMeta) -> None:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not a shard split; valid: {', '.join(SPLITS)}")
        self.directory, self.split, self.meta = Path(directory), split, meta
        self.dtype = np.dtype(meta.dtype).newbyteorder("<")
        self.segments = meta.segments(split)
        for seg in self.segments:
            _check_file(self.directory / seg["file"], seg, self.dtype, meta)
        self.offsets = np.cumsum([0] + [seg["tokens"] for seg in self.segments])
        self._maps: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _open(self) -> list[np.ndarray]:
        if self._maps is None:
            self._maps = [self._map(s) for s in self.segments]
        return self._maps

    def _map(self, seg: dict) -> np.ndarray:
        if not seg["tokens"]:
            return np.zeros(0, dtype=self.dtype)  # np.memmap refuses empty files
        mapped = np.memmap(self.directory / seg["file"], dtype=self.dtype, mode="r")
        return mapped[seg["offset"] : seg["offset"] + seg["tokens"]]

    def __getitem__(self, index: slice | int) -> np.ndarray:
        if isinstance(index, int | np.integer):
            return self[int(index) : int(index) + 1][0]
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("SplitTokens slices must be contiguous")
        maps, parts = self._open(), []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for k in range(max(first, 0), len(maps)):
            lo = self.offsets[k]
            if lo >= stop:
                break
            parts.append(maps[k][max(0, start - lo) : stop - lo])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out.astype(dtype) if dtype is not None else np.asarray(out)

    def tolist(self) -> list[int]:
        return self[:].tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": None}


def _check_file(path: Path, seg: dict, dtype: np.dtype, meta: ShardMeta) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"shard file {str(path)!r} is missing (meta.json lists it)")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise ValueError(
            f"shard file {str(path)!r} has {size} bytes, not a whole number of {meta.dtype} tokens "
            f"({dtype.itemsize} bytes each): it is truncated or not a shard"
        )
    need = (seg["offset"] + seg["tokens"]) * dtype.itemsize
    exact = meta.format_version < 2 or meta.split_by == "document"
    if (exact and size != need) or size < need:
        raise ValueError(
            f"shard file {str(path)!r} has {size} bytes, meta.json expects {seg['offset'] + seg['tokens']} "
            f"{meta.dtype} tokens ({need} bytes)"
        )


def open_split(directory: str | Path, split: str, meta: ShardMeta | None = None) -> SplitTokens:
    """One split's tokens (checked against the manifest and the vocabulary), read lazily."""
    meta = meta or read_meta(directory)
    if meta.max_token_id is not None and meta.max_token_id >= meta.vocab_size:
        raise ValueError(
            f"shards in {str(directory)!r} hold token id {meta.max_token_id}, beyond vocab_size={meta.vocab_size}; "
            "valid: ids below the vocabulary (re-run datamodules.text.prepare with a larger --vocab-size)"
        )
    return SplitTokens(directory, split, meta)


def open_shard(directory: str | Path, split: str, meta: ShardMeta | None = None) -> np.ndarray:
    """A split's tokens as one array: a read-only memory map when one file holds it (a copy otherwise)."""
    tokens = open_split(directory, split, meta)
    return tokens[:] if len(tokens.segments) == 1 else np.asarray(tokens)


def load_shard_tokenizer(directory: str | Path, meta: ShardMeta | None = None) -> TextTokenizer:
    """Loads the tokenizer saved beside the shards and checks it against meta.json."""
    meta = meta or read_meta(directory)
    tokenizer = load_tokenizer(directory, meta.tokenizer)  # type: ignore[arg-type]
    if tokenizer.vocab_size != meta.tokenizer_vocab_size or tokenizer.vocab_size > meta.vocab_size:
        raise ValueError(
            f"tokenizer in {str(directory)!r} has {tokenizer.vocab_size} tokens but meta.json records "
            f"{meta.tokenizer_vocab_size} (vocab_size={meta.vocab_size}); re-run datamodules.text.prepare"
        )
    return tokenizer
