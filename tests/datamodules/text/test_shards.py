"""Token shards: dtype choice, contiguous split of one document, memmap round trip, manifest checks, the first
format, the prepare CLI on plain text files."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from datamodules.text.pipeline import prepare_text_shards
from datamodules.text.prepare import main as prepare_main
from datamodules.text.shards import (
    SPLITS,
    check_fractions,
    has_shards,
    load_shard_tokenizer,
    open_shard,
    read_meta,
    shard_dtype,
    split_bounds,
    write_shards,
)
from datamodules.text.tokenizers import BPETokenizer, ByteTokenizer

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200))


@pytest.mark.parametrize(("vocab", "dtype"), [(256, "uint16"), (50257, "uint16"), (65535, "uint16"), (65536, "uint32")])
def test_dtype_follows_vocab_size(vocab: int, dtype: str) -> None:
    assert shard_dtype(vocab).name == dtype


def test_split_bounds_by_hand() -> None:
    assert split_bounds(100, 0.1, 0.2) == {"train": (0, 70), "val": (70, 80), "test": (80, 100)}


@pytest.mark.parametrize("num_tokens", [1, 37, 1000, 123457])
@pytest.mark.parametrize(("val", "test"), [(0.05, 0.05), (0.1, 0.3), (0.33, 0.33)])
def test_split_bounds_are_contiguous_disjoint_and_cover(num_tokens: int, val: float, test: float) -> None:
    bounds = split_bounds(num_tokens, val, test)
    assert list(bounds) == ["train", "val", "test"]
    assert bounds["train"][0] == 0 and bounds["test"][1] == num_tokens
    assert bounds["train"][1] == bounds["val"][0] and bounds["val"][1] == bounds["test"][0]
    assert abs((bounds["val"][1] - bounds["val"][0]) - val * num_tokens) <= 0.5
    assert split_bounds(num_tokens, val, test) == bounds  # deterministic


@pytest.mark.parametrize(("vocab", "dtype"), [(256, np.uint16), (70_000, np.uint32)])
def test_write_then_memmap_read_round_trip(tmp_path: Path, vocab: int, dtype: type) -> None:
    tokens = np.random.default_rng(0).integers(0, vocab, size=10_001)
    tokens[:2] = [0, vocab - 1]  # both ends of the id range survive
    meta = write_shards(
        tokens, tmp_path, ByteTokenizer(), vocab_size=vocab, corpus="c", source="s", val_fraction=0.1, test_fraction=0.1
    )
    assert meta == read_meta(tmp_path)
    assert meta.dtype == np.dtype(dtype).name and meta.num_tokens == 10_001
    parts = [open_shard(tmp_path, split) for split in SPLITS]
    assert all(isinstance(p, np.memmap) and p.dtype == dtype for p in parts)
    assert [len(p) for p in parts] == [meta.split_tokens[s] for s in SPLITS] == [8001, 1000, 1000]
    np.testing.assert_array_equal(np.concatenate(parts), tokens)
    assert (tmp_path / "tokens-00000.bin").stat().st_size == 10_001 * np.dtype(dtype).itemsize  # flat, no header
    assert meta.files["val"] == [{"file": "tokens-00000.bin", "offset": 8001, "tokens": 1000}]
    saved = json.loads((tmp_path / "meta.json").read_text())
    assert saved["split_fractions"] == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert saved["tokenizer"] == "byte" and saved["vocab_size"] == vocab


def test_out_of_range_ids_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"token ids span \[0, 300\], outside \[0, vocab_size=256\)"):
        write_shards(
            np.array([0, 300]),
            tmp_path,
            ByteTokenizer(),
            vocab_size=256,
            corpus="c",
            source="s",
            val_fraction=0.1,
            test_fraction=0.1,
        )
    assert not has_shards(tmp_path)


def test_missing_meta_and_truncated_shard_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"holds no token shards: meta\.json is missing"):
        read_meta(tmp_path)
    write_shards(
        np.arange(100),
        tmp_path,
        ByteTokenizer(),
        vocab_size=256,
        corpus="c",
        source="s",
        val_fraction=0.1,
        test_fraction=0.1,
    )
    (tmp_path / "tokens-00000.bin").write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match=r"tokens-00000\.bin' has 2 bytes, meta\.json expects 100 uint16 tokens"):
        open_shard(tmp_path, "test")
    (tmp_path / "tokens-00000.bin").write_bytes(b"\x00\x00\x00")
    with pytest.raises(ValueError, match=r"tokens-00000\.bin' has 3 bytes, not a whole number of uint16 tokens"):
        open_shard(tmp_path, "val")


def test_shards_of_the_first_format_still_load(tmp_path: Path) -> None:
    tokens = (np.arange(100) % 256).astype("<u2")
    for split, part in zip(SPLITS, (tokens[:80], tokens[80:90], tokens[90:]), strict=True):
        part.tofile(tmp_path / f"{split}.bin")
    ByteTokenizer().save(tmp_path)
    meta = {"dtype": "uint16", "vocab_size": 256, "tokenizer": "byte", "tokenizer_vocab_size": 256, "num_tokens": 100,
            "split_tokens": {"train": 80, "val": 10, "test": 10}, "corpus": "c", "source": "s", "format_version": 1,
            "split_fractions": {"train": 0.8, "val": 0.1, "test": 0.1}}  # fmt: skip
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    np.testing.assert_array_equal(np.concatenate([open_shard(tmp_path, s) for s in SPLITS]), tokens)


@pytest.mark.parametrize(
    ("val", "test", "message"),
    [
        (0.0, 0.1, "val_fraction=0.0 must lie strictly between 0 and 1"),
        (0.1, 1.5, "test_fraction=1.5 must lie strictly between 0 and 1"),
        (0.5, 0.5, "val_fraction + test_fraction = 1.0 must be < 1"),
    ],
)
def test_bad_fractions_name_the_value(val: float, test: float, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_fractions(val, test)


def test_tokenizer_that_does_not_match_meta_is_refused(tmp_path: Path) -> None:
    meta = prepare_text_shards(_write(tmp_path / "t.txt"), tmp_path / "s", tokenizer="bpe", vocab_size=300)
    assert load_shard_tokenizer(tmp_path / "s").vocab_size == meta.tokenizer_vocab_size
    BPETokenizer.train(TEXT, vocab_size=280).save(tmp_path / "s")  # someone swapped tokenizer.json
    with pytest.raises(ValueError, match=r"has \d+ tokens but meta\.json records \d+ \(vocab_size=300\)"):
        load_shard_tokenizer(tmp_path / "s")


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_prepare_cli_writes_shards_that_decode_back_to_the_text(tmp_path: Path, tokenizer: str) -> None:
    out = tmp_path / "shards"
    prepare_main(
        ["--input", _write(tmp_path / "t.txt"), "--out", str(out), "--tokenizer", tokenizer, "--vocab-size", "300"]
    )
    meta = read_meta(out)
    assert meta.tokenizer == tokenizer and meta.corpus == "t"
    assert meta.vocab_size == (256 if tokenizer == "byte" else 300)
    tok = load_shard_tokenizer(out, meta)
    ids = np.concatenate([open_shard(out, s, meta) for s in SPLITS])
    assert tok.decode(ids.tolist()) == TEXT
    assert meta.num_tokens == len(ids) and (len(ids) < len(TEXT)) == (tokenizer == "bpe")


def _write(path: Path) -> str:
    path.write_text(TEXT)
    return str(path)


def test_prepare_cli_reports_a_bad_input_in_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        prepare_main(["--input", str(tmp_path / "x"), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    expected = f"error: input {str(tmp_path / 'x')!r} does not exist; valid: 'embedded', .txt"
    assert capsys.readouterr().err.startswith(expected)
    assert not (tmp_path / "out").exists()


def test_an_identical_rewrite_never_hides_the_finished_set(tmp_path: Path, monkeypatch) -> None:
    """Two runs of a parallel sweep may prepare one cache entry at once: while the second writes, the
    first must keep seeing a complete set (meta.json present) at every step."""
    import datamodules.text.shards as shards

    source = _write(tmp_path / "t.txt")
    prepare_text_shards(source, tmp_path / "cache", tokenizer="byte")
    seen, replace = [], os.replace

    def checked_replace(src, dst):
        seen.append(has_shards(tmp_path / "cache"))
        return replace(src, dst)

    monkeypatch.setattr(shards.os, "replace", checked_replace)
    prepare_text_shards(source, tmp_path / "cache", tokenizer="byte")
    assert seen and all(seen)
    assert not list((tmp_path / "cache").glob(".staging-*"))  # the staging directory is cleaned up


def test_rewrite_keeps_open_memmaps_valid_and_replaces_the_meta(tmp_path: Path) -> None:
    tokens = np.arange(1000) % 256
    kwargs = {"corpus": "c", "source": "s", "val_fraction": 0.1, "test_fraction": 0.1}
    write_shards(tokens, tmp_path, ByteTokenizer(), vocab_size=256, **kwargs)
    before = open_shard(tmp_path, "train")
    write_shards(tokens[::-1].copy(), tmp_path, ByteTokenizer(), vocab_size=256, **kwargs)
    np.testing.assert_array_equal(before, tokens[:800])  # the reader keeps the file it opened
    np.testing.assert_array_equal(open_shard(tmp_path, "train"), tokens[::-1][:800])
    write_shards(tokens, tmp_path, ByteTokenizer(), vocab_size=257, **kwargs)
    assert read_meta(tmp_path).vocab_size == 257 and not list(tmp_path.glob(".staging-*"))
