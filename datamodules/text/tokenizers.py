"""Tokenizers for the LM task: raw UTF-8 bytes, or a byte-level BPE trained on the corpus.

Both follow one small protocol (`TextTokenizer`): `vocab_size`, `encode`, `decode`,
`encode_array` (bulk, for shard writing), `save(dir)` and `load(dir)`.

    byte:  "hé" -> b"h\\xc3\\xa9" -> [104, 195, 169]               vocab 256, nothing to train
    bpe:   GPT-2 style byte-level BPE (Sennrich et al. 2016; Radford et al. 2019) trained with
           HuggingFace `tokenizers`, saved as tokenizer.json; any tokenizer.json loads the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, Protocol, Self, get_args

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TokenizerKind = Literal["byte", "bpe"]
TOKENIZER_KINDS: tuple[str, ...] = get_args(TokenizerKind)
BYTE_FILE = "byte_tokenizer.json"
BPE_FILE = "tokenizer.json"
MIN_BPE_VOCAB = 256  # the byte alphabet; fewer tokens cannot cover every input

# Chunk boundary for bulk encoding: a newline followed by a non-space, so no whitespace run or
# word is ever cut in two (byte-level pre-tokenization would split it differently).
_CHUNK_BOUNDARY = re.compile(r"\n(?=\S)")
_CHUNK_CHARS = 1 << 16


class TextTokenizer(Protocol):
    """What the data and LM code need from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_array(self, text: str) -> np.ndarray: ...

    def save(self, directory: str | Path) -> None: ...

    @classmethod
    def load(cls, directory: str | Path) -> Self: ...


def read_json_text(path: Path) -> str:
    """A tokenizer file's text if it is a JSON object; a one-line ValueError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
        if not isinstance(json.loads(text), dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: nested past reading
        raise ValueError(f"{str(path)!r} is not a JSON tokenizer file ({type(err).__name__}); re-create it") from None
    return text


def iter_chunks(text: str, chunk_chars: int = _CHUNK_CHARS) -> Iterator[str]:
    """Splits `text` into ~chunk_chars pieces at line starts; the pieces concatenate back to `text`."""
    start = 0
    while start < len(text):
        match = _CHUNK_BOUNDARY.search(text, start + chunk_chars)
        end = match.end() if match else len(text)
        yield text[start:end]
        start = end


class ByteTokenizer:
    """UTF-8 bytes as tokens: exact round trip for any text, vocab 256."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Decodes ids; a window cut mid-character decodes with U+FFFD instead of failing."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def encode_array(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / BYTE_FILE).write_text(json.dumps({"kind": self.kind, "vocab_size": 256}) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Self:
        path = Path(directory) / BYTE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no byte tokenizer in {str(directory)!r}: {BYTE_FILE} is missing")
        if json.loads(read_json_text(path)).get("kind") != "byte":
            raise ValueError(f"{str(path)!r} does not describe a byte tokenizer (its 'kind' is not 'byte')")
        return cls()


class BPETokenizer:
    """A HuggingFace `tokenizers` tokenizer (byte-level BPE when trained here), stored as tokenizer.json."""

    kind = "bpe"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.hf = tokenizer
        ids = tokenizer.get_vocab(with_added_tokens=True).values()
        # The id space, not the token count: a tokenizer.json may leave gaps (ids up to 70000 for 50000 tokens),
        # and every id must fit the embedding table and the shard dtype.
        self._id_space = max(ids, default=-1) + 1

    @classmethod
    def train(cls, texts: str | Sequence[str], vocab_size: int) -> BPETokenizer:
        """Trains a byte-level BPE on `texts`.

        Args:
            texts: The corpus, or several documents.
            vocab_size: Upper bound on the vocabulary (the 256 byte symbols plus merges); a small
                corpus may stop short of it.
        """
        check_bpe_vocab_size(vocab_size)
        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
            show_progress=False,
            special_tokens=[],
        )
        docs = [texts] if isinstance(texts, str) else list(texts)
        hf.train_from_iterator((chunk for doc in docs for chunk in iter_chunks(doc)), trainer=trainer)
        return cls(hf)

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (the token count when the ids have no gaps, as in every BPE trained here)."""
        return self._id_space

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def encode_array(self, text: str) -> np.ndarray:
        """Encodes a whole corpus in parallel chunks (split at line starts)."""
        encodings = self.hf.encode_batch(list(iter_chunks(text)), add_special_tokens=False)
        if not encodings:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(directory / BPE_FILE))

    @classmethod
    def load(cls, directory: str | Path) -> Self:
        """Reads ``tokenizer.json``: JSON text only (nothing in it can run code), checked before HF parses it."""
        path = Path(directory) / BPE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no BPE tokenizer in {str(directory)!r}: {BPE_FILE} is missing")
        text = read_json_text(path)
        try:
            return cls(Tokenizer.from_str(text))
        except Exception as err:  # noqa: BLE001 - the Rust library raises a bare Exception
            raise ValueError(f"{str(path)!r} is not a tokenizers tokenizer.json: {str(err).splitlines()[0]}") from None


_CLASSES: dict[str, type[ByteTokenizer] | type[BPETokenizer]] = {"byte": ByteTokenizer, "bpe": BPETokenizer}


def check_kind(kind: str) -> None:
    """Raises a one-line ValueError unless `kind` is a known tokenizer kind."""
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"tokenizer={kind!r} is not a tokenizer kind; valid: {', '.join(TOKENIZER_KINDS)}")


def check_bpe_vocab_size(vocab_size: int) -> None:
    """Raises a one-line ValueError unless a BPE vocab can hold the byte alphabet."""
    if not MIN_BPE_VOCAB <= vocab_size <= 2**32 - 1:
        raise ValueError(f"bpe_vocab_size={vocab_size} must lie in [{MIN_BPE_VOCAB}, 2**32-1]")


def build_tokenizer(
    kind: TokenizerKind, text: str | Sequence[str] | None = None, vocab_size: int = 4096
) -> TextTokenizer:
    """Makes a tokenizer: "byte" needs nothing, "bpe" is trained on `text` up to `vocab_size`."""
    check_kind(kind)
    if kind == "byte":
        return ByteTokenizer()
    if text is None:
        raise ValueError("tokenizer='bpe' needs training text; pass text=...")
    return BPETokenizer.train(text, vocab_size)


def load_tokenizer(directory: str | Path, kind: TokenizerKind | None = None) -> TextTokenizer:
    """Loads the tokenizer saved in `directory`; `kind` None detects it from the files present."""
    directory = Path(directory)
    if kind is None:
        kind = "bpe" if (directory / BPE_FILE).is_file() else "byte"
        if kind == "byte" and not (directory / BYTE_FILE).is_file():
            raise FileNotFoundError(f"no tokenizer in {str(directory)!r}: expected {BPE_FILE} or {BYTE_FILE}")
    check_kind(kind)
    return _CLASSES[kind].load(directory)
