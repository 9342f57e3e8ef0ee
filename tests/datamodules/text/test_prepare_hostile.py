"""prepare_text on careless or hostile inputs: nothing is silently lost or wrapped, every refusal is one line.

Each refusal: exit status 2, one ``error:`` line naming the file or option, ``--out`` never created, and every
input file's sha256 unchanged.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer, models, pre_tokenizers

from datamodules.text.compressed import check_zstd_frames
from datamodules.text.prepare import main as prepare_main
from datamodules.text.shards import open_split, read_meta

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


def hashes(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(args: list[str], tmp_path: Path, capsys) -> str:
    """Runs prepare_text, asserts the refusal's shape and that nothing was written or changed; returns the line."""
    before = hashes(tmp_path)
    with pytest.raises(SystemExit) as exc:
        prepare_main([*args, "--out", str(tmp_path / "out"), "--no-progress", "--workers", "0"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() and hashes(tmp_path) == before
    return err


def jsonl(n: int) -> bytes:
    return "".join(json.dumps({"text": f"{' '.join(WORDS)} number {i}"}) + "\n" for i in range(n)).encode()


#################################################################################
#                  Ids beyond a tokenizer's token count                          #
#################################################################################


def sparse_tokenizer(path: Path, top: int = 70_000) -> Path:
    """A word-level tokenizer.json of 11 tokens whose ids have a gap: 'far' is ``top``."""
    vocab = {"[UNK]": 0, "<|endoftext|>": 1, **{w: 2 + i for i, w in enumerate(dict.fromkeys(WORDS))}, "far": top}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def test_ids_beyond_the_token_count_are_stored_whole(tmp_path: Path):
    """70000 in a vocabulary of 11 tokens: the shards are uint32 and hold 70000, not 70000 mod 65536 = 4464."""
    tokenizer = sparse_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "far.txt"
    text.write_text(("the far fox " * 300).strip())
    prepare_main(["--input", str(text), "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer),
                  "--no-progress", "--workers", "0"])  # fmt: skip
    meta = read_meta(tmp_path / "out")
    assert (meta.dtype, meta.vocab_size, meta.max_token_id) == ("uint32", 70_001, 70_000)
    ids = open_split(tmp_path / "out", "train")[:30].tolist()
    assert ids[:6] == [2, 70_000, 5, 2, 70_000, 5] and 4464 not in ids


def test_a_vocab_size_below_the_largest_id_is_refused(tmp_path: Path, capsys):
    tokenizer = sparse_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "far.txt"
    text.write_text("the far fox " * 300)
    line = refused(["--input", str(text), "--tokenizer", str(tokenizer), "--vocab-size", "50304"], tmp_path, capsys)
    assert f"tokenizer {str(tokenizer)!r} has ids up to 70000 (11 tokens), more than vocab_size=50304 holds" in line
    assert "valid: --vocab-size 70001 or more" in line


#################################################################################
#                    Compressed inputs must be whole                              #
#################################################################################


@pytest.mark.parametrize("cut", ["half", "last-4-bytes"])
def test_a_zst_cut_short_is_refused(cut: str, tmp_path: Path, capsys):
    whole = zstandard.ZstdCompressor().compress(jsonl(2000))
    path = tmp_path / "corpus.jsonl.zst"
    path.write_bytes(whole[: len(whole) // 2] if cut == "half" else whole[:-4])
    line = refused(["--input", str(path)], tmp_path, capsys)
    assert f"{str(path)!r} is not a complete zstd file: the file ends inside a block (cut short)" in line


def test_random_bytes_named_zst_and_a_truncated_gz_are_refused(tmp_path: Path, capsys):
    noise = tmp_path / "noise.jsonl.zst"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    line = refused(["--input", str(noise)], tmp_path, capsys)
    assert f"{str(noise)!r} is not a complete zstd file: does not start with zstd's magic number" in line
    noise.unlink()
    cut = tmp_path / "corpus.jsonl.gz"
    cut.write_bytes(gzip.compress(jsonl(2000))[:-100])
    line = refused(["--input", str(cut)], tmp_path, capsys)
    assert f"{str(cut)!r} cannot be decompressed (Compressed file ended before the end-of-stream marker" in line


def test_every_frame_of_a_multi_frame_zst_is_read(tmp_path: Path):
    """Two frames back to back (``cat a.zst b.zst``): both halves of the corpus arrive."""
    path = tmp_path / "two.jsonl.zst"
    compress = zstandard.ZstdCompressor(write_checksum=True).compress
    path.write_bytes(compress(jsonl(300)) + compress(jsonl(600)[len(jsonl(300)) :]))
    assert check_zstd_frames(path) == 2
    prepare_main(["--input", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--workers", "0"])
    assert sum(read_meta(tmp_path / "out").split_documents.values()) == 600


#################################################################################
#                         Right name, wrong content                               #
#################################################################################


def test_a_parquet_text_column_of_integers_is_refused(tmp_path: Path, capsys):
    path = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"text": pa.array(range(100), pa.int64()), "body": [f"doc {i}" for i in range(100)]}), path)
    line = refused(["--input", str(path)], tmp_path, capsys)
    assert f"{str(path)!r} column 'text' holds int64, not text; valid: --text-key naming a string column (body)" in line


@pytest.mark.parametrize(
    ("line_text", "needle"),
    [("[" * 50_000 + "]" * 50_000, "line 2 is not JSON (nested too deeply)"),
     ('{"text": "caf\\udce9"}', "line 2 'text' holds a byte that is not UTF-8 at character 3")],
    ids=["deep", "lone-surrogate"],
)  # fmt: skip
def test_a_jsonl_line_that_is_no_text_is_refused(line_text: str, needle: str, tmp_path: Path, capsys):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": "a fine first line"}) + "\n" + line_text + "\n")
    assert needle in refused(["--input", str(path)], tmp_path, capsys)


@pytest.mark.parametrize("option", ["--bpe-sample-mb", "--checkpoint-mb"])
@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "-1"])
def test_sizes_must_be_finite_and_positive(option: str, value: str, tmp_path: Path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("some text\n" * 50)
    line = refused(["--input", str(text), option, value], tmp_path, capsys)
    assert line.startswith(f"error: {option}={value!r} ") and "(command line)" in line
