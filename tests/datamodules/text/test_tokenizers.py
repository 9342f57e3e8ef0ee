"""Tokenizers: exact byte round trips, BPE training/save/load identity, factory errors."""

from __future__ import annotations

import re
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pytest

from datamodules.text.tokenizers import (
    BPE_FILE,
    BYTE_FILE,
    BPETokenizer,
    ByteTokenizer,
    build_tokenizer,
    iter_chunks,
    load_tokenizer,
)

SAMPLES = ["", "hello world", "héllo wörld — ∑ 🤖\n\ttabs  and  spaces\n", "line one\nline two\n\n"]
# A small real corpus: a few pydoc topics (always installed), ~40 KB.
CORPUS = "\n\n".join(topics[k] for k in sorted(topics)[:12])


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=400)


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_round_trip_is_exact(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode_array(text).tolist() == ids


def test_byte_ids_by_hand_and_broken_utf8_decodes_with_replacement() -> None:
    tok = ByteTokenizer()
    assert tok.vocab_size == 256
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.decode([104, 195]) == "h\ufffd"  # a window cut mid-character


def test_byte_save_load(tmp_path: Path) -> None:
    ByteTokenizer().save(tmp_path)
    assert (tmp_path / BYTE_FILE).is_file()
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)
    assert isinstance(load_tokenizer(tmp_path, "byte"), ByteTokenizer)


def test_bpe_learns_merges_within_the_requested_vocab(bpe: BPETokenizer) -> None:
    assert 256 < bpe.vocab_size <= 400
    ids = bpe.encode(CORPUS)
    assert len(ids) < len(CORPUS.encode("utf-8")) * 0.7  # merges compress the training text
    assert max(ids) < bpe.vocab_size


@pytest.mark.parametrize("text", SAMPLES + [CORPUS[:3000]])
def test_bpe_round_trip_and_save_load_identity(bpe: BPETokenizer, text: str, tmp_path: Path) -> None:
    bpe.save(tmp_path)
    assert (tmp_path / BPE_FILE).is_file()
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, BPETokenizer)
    assert loaded.vocab_size == bpe.vocab_size
    assert loaded.encode(text) == bpe.encode(text)
    assert loaded.decode(bpe.encode(text)) == text


def test_bpe_training_is_deterministic(bpe: BPETokenizer) -> None:
    again = BPETokenizer.train(CORPUS, vocab_size=400)
    assert again.encode(CORPUS) == bpe.encode(CORPUS)


def test_chunks_concatenate_back_and_bulk_encoding_round_trips(bpe: BPETokenizer) -> None:
    chunks = list(iter_chunks(CORPUS, chunk_chars=1000))
    assert len(chunks) > 5 and "".join(chunks) == CORPUS
    assert all(c.endswith("\n") for c in chunks[:-1])
    ids = bpe.encode_array(CORPUS)
    assert ids.dtype == np.int64
    assert bpe.decode(ids.tolist()) == CORPUS
    short = "a single chunk of text\n"
    assert bpe.encode_array(short).tolist() == bpe.encode(short)


def test_build_tokenizer_kinds() -> None:
    assert isinstance(build_tokenizer("byte"), ByteTokenizer)
    tok = build_tokenizer("bpe", text=CORPUS[:5000], vocab_size=300)
    assert isinstance(tok, BPETokenizer) and tok.vocab_size <= 300


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kind": "wordpiece"}, ValueError, "tokenizer='wordpiece' is not a tokenizer kind; valid: byte, bpe"),
        ({"kind": "bpe"}, ValueError, "needs training text"),
        ({"kind": "bpe", "text": "abc", "vocab_size": 100}, ValueError, "bpe_vocab_size=100 must lie in [256"),
    ],
)
def test_build_tokenizer_errors_name_the_bad_value(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error) as info:
        build_tokenizer(**kwargs)
    assert message in str(info.value)


def test_load_from_an_empty_directory_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path))):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match=BPE_FILE):
        load_tokenizer(tmp_path, "bpe")
