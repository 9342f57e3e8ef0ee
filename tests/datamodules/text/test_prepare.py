"""``python -m datamodules.text.prepare`` on generated web-style corpora: parquet, jsonl.gz and jsonl.zst shards give
exactly the tokens of each document encoded alone; the split is by document and deterministic; memory stays
flat as the input grows; a kill mid-way then the same command gives byte-identical shards; bad input is one line."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import Tokenizer

from datamodules.text.corpus import document_key
from datamodules.text.pipeline import BYTE_EOD
from datamodules.text.prepare import main as prepare_main
from datamodules.text.shards import SPLITS, open_split, read_meta, split_of_key

ROOT = Path(__file__).resolve().parents[3]
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "had",
    "not",
]


def documents(n: int, seed: int = 0, words: int = 60) -> list[str]:
    """``n`` documents of plain and non-ASCII text (UTF-8 of several bytes per character included)."""
    rng = np.random.default_rng(seed)
    vocab = np.array(WORDS + ["naïve", "café", "Ω", "日本語", "\n\n", "—"])
    return [" ".join(rng.choice(vocab, size=int(rng.integers(5, words)))) + f" #{i}" for i in range(n)]


def write_corpus(root: Path, docs: list[str]) -> Path:
    """The documents over three shards of three formats (FineWeb-Edu-like layout: a directory of files)."""
    root.mkdir(parents=True)
    third = len(docs) // 3
    parts = [docs[:third], docs[third : 2 * third], docs[2 * third :]]
    pq.write_table(pa.table({"id": list(range(len(parts[0]))), "text": parts[0]}), root / "a-000.parquet")
    with gzip.open(root / "b-001.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"text": d, "url": "x"}) + "\n" for d in parts[1])
    with open(root / "c-002.jsonl.zst", "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as fh:
        fh.write("".join(json.dumps({"text": d}) + "\n" for d in parts[2]).encode())
    return root


def prepare(*args: str) -> None:
    prepare_main([*args, "--no-progress"])


def split_streams(docs: list[str], encode, eod: int) -> dict[str, list[int]]:
    """The reference: each document encoded alone, an end-of-document id after it, in corpus order per split."""
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    for doc in docs:
        split = SPLITS[split_of_key(document_key(doc), 0.1, 0.1)]
        out[split] += [*encode(doc), eod]
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_bpe_shards_hold_each_document_encoded_alone(tmp_path: Path, workers: int):
    docs = documents(600)
    corpus = write_corpus(tmp_path / "corpus", docs)
    out = tmp_path / "out"
    prepare("--input", str(corpus), "--out", str(out), "--tokenizer", "bpe", "--vocab-size", "400", "--val-fraction",
            "0.1", "--test-fraction", "0.1", "--workers", str(workers), "--shard-tokens", "997")  # fmt: skip
    meta = read_meta(out)
    hf = Tokenizer.from_file(str(out / "tokenizer.json"))
    eod = hf.token_to_id("<|endoftext|>")
    assert meta.eod_id == eod and meta.split_by == "document" and meta.tokenizer_vocab_size <= 400
    expected = split_streams(docs, lambda d: hf.encode(d, add_special_tokens=False).ids, eod)
    for split in SPLITS:
        got = open_split(out, split, meta)
        assert got[:].tolist() == expected[split], split
        assert all(seg["tokens"] <= 997 for seg in meta.files[split])  # bounded shard files
        assert meta.split_documents[split] == expected[split].count(eod)
    assert sum(meta.split_documents.values()) == 600 and [i["documents"] for i in meta.inputs] == [200, 200, 200]
    assert len(meta.files["train"]) > 1 and meta.tokenizer_sha256 and meta.max_token_id < 400


def test_byte_shards_and_a_deterministic_split_by_document(tmp_path: Path):
    docs = documents(300, seed=1)
    corpus = write_corpus(tmp_path / "corpus", docs)
    prepare("--input", str(corpus), "--out", str(tmp_path / "a"), "--val-fraction", "0.1", "--test-fraction", "0.1",
            "--workers", "2")  # fmt: skip
    prepare("--input", str(corpus), "--out", str(tmp_path / "b"), "--val-fraction", "0.1", "--test-fraction", "0.1",
            "--workers", "0")  # fmt: skip
    expected = split_streams(docs, lambda d: list(d.encode("utf-8")), BYTE_EOD)
    for split in SPLITS:
        assert open_split(tmp_path / "a", split)[:].tolist() == expected[split]
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:  # any worker count: the same bytes
        if name != "meta.json":
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # A document repeated in the corpus always lands in the same split: no leak from train into test.
    assert {SPLITS[split_of_key(document_key(d), 0.1, 0.1)] for d in [docs[0]] * 3} == {
        SPLITS[split_of_key(document_key(docs[0]), 0.1, 0.1)]
    }


def test_a_given_tokenizer_json_and_a_larger_model_vocabulary(tmp_path: Path):
    docs = documents(90, seed=2)
    corpus = write_corpus(tmp_path / "corpus", docs)
    prepare("--input", str(corpus), "--out", str(tmp_path / "trained"), "--tokenizer", "bpe", "--vocab-size", "300")
    given = tmp_path / "trained" / "tokenizer.json"  # stands for a local GPT-NeoX / OLMo tokenizer.json
    prepare("--input", str(corpus), "--out", str(tmp_path / "out"), "--tokenizer", str(given), "--vocab-size", "512")
    meta = read_meta(tmp_path / "out")
    assert meta.vocab_size == 512 and meta.tokenizer == "bpe" and meta.tokenizer_vocab_size <= 300
    for split in SPLITS:
        assert open_split(tmp_path / "out", split)[:].tolist() == open_split(tmp_path / "trained", split)[:].tolist()


def _run(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "datamodules.text.prepare", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)  # fmt: skip


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _big_jsonl_zst(path: Path, megabytes: int) -> int:
    """A generated jsonl.zst corpus of about ``megabytes`` MB of text (repetitive, so it compresses fast)."""
    rng = np.random.default_rng(3)
    pool = [" ".join(rng.choice(np.array(WORDS), size=200)) for _ in range(64)]
    lines = [json.dumps({"text": f"{pool[i % 64]} {i}"}) + "\n" for i in range(4096)]
    block = "".join(lines).encode()
    written = 0
    with open(path, "wb") as raw, zstandard.ZstdCompressor(level=1).stream_writer(raw) as fh:
        while written < megabytes * 2**20:
            fh.write(block)
            written += len(block)
    return written


def _peak_rss_kb(inp: Path, out: Path) -> int:
    """Peak RSS of the largest process of a run (the main one or a worker), in kB."""
    code = (f"import resource, subprocess, sys; subprocess.run([sys.executable, '-m', 'datamodules.text.prepare', "
            f"'--input', {str(inp)!r}, '--out', {str(out)!r}, '--workers', '2', '--no-progress'], check=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_memory_stays_flat_as_the_input_grows(tmp_path: Path):
    big, small = tmp_path / "big" / "corpus.jsonl.zst", tmp_path / "small" / "corpus.jsonl.zst"
    big.parent.mkdir()
    small.parent.mkdir()
    text_bytes = _big_jsonl_zst(big, 160)
    _big_jsonl_zst(small, 8)
    rss_small, rss_big = _peak_rss_kb(small, tmp_path / "out-small"), _peak_rss_kb(big, tmp_path / "out-big")
    # 20x the text, < 150 MB more: holding the text (160 MB) or its tokens (>= 320 MB as uint16) would not fit.
    assert text_bytes > 160e6 and rss_big - rss_small < 150_000, (rss_small, rss_big)
    assert read_meta(tmp_path / "out-big").num_tokens > 160e6


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_a_kill_then_the_same_command_gives_the_same_bytes(tmp_path: Path, request):
    started: list[subprocess.Popen] = []
    # each in its own session; at the end every process of it goes (a killed prepare's pool workers too)
    request.addfinalizer(lambda: [_kill_group(p) for p in started])
    corpus = tmp_path / "corpus.jsonl.zst"
    _big_jsonl_zst(corpus, 48)
    common = ["--input", str(corpus), "--workers", "2", "--checkpoint-mb", "4", "--shard-tokens", "5000000"]
    whole, again = tmp_path / "whole", tmp_path / "again"
    subprocess.run([sys.executable, "-m", "datamodules.text.prepare", *common, "--out", str(whole), "--no-progress"],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    args = [*common, "--out", str(again), "--no-progress"]
    # Killed (SIGKILL, nothing saved on the way out) after its second saved state, then the same command again.
    proc = _run(args, start_new_session=True)
    started.append(proc)
    state = again / ".prepare" / "state.json"
    deadline = time.monotonic() + 300

    def saved() -> int:
        try:
            return json.loads(state.read_text())["progress"]["text_bytes"]
        except (OSError, ValueError):
            return 0

    while saved() < 8e6:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert not (again / "meta.json").exists()
    # Stopped by SIGTERM this time, once it works again: it saves its state at the next batch and exits 143.
    killed_at = saved()
    proc = _run(args, start_new_session=True)
    started.append(proc)
    while saved() <= killed_at:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "SIGTERM, stopped after" in err, err
    assert time.monotonic() - start < 20, "SIGTERM must stop it within seconds"
    assert saved() > killed_at  # it kept what it had done
    done = subprocess.run([sys.executable, "-m", "datamodules.text.prepare", *args], cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0 and "resuming" in done.stderr, done.stderr
    names = sorted(p.name for p in whole.iterdir() if p.name != "meta.json")
    assert len(names) > 3 and names == sorted(p.name for p in again.iterdir() if p.name != "meta.json")
    for name in names:
        assert (whole / name).read_bytes() == (again / name).read_bytes(), name
    assert read_meta(whole).split_tokens == read_meta(again).split_tokens


def one_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        prepare_main(args)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_another_corpus_in_out_is_refused_unless_overwrite(tmp_path: Path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("first corpus " * 200)
    b.write_text("second corpus " * 200)
    out = tmp_path / "out"
    prepare("--input", str(a), "--out", str(out))
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    prepare("--input", str(a), "--out", str(out))  # the same command: nothing to do
    assert "already prepared" in capsys.readouterr().out
    err = one_line(["--input", str(b), "--out", str(out), "--no-progress"], capsys)
    assert "already holds the shards of corpus 'a'" in err and "--overwrite" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # untouched
    prepare("--input", str(b), "--out", str(out), "--overwrite")
    assert read_meta(out).corpus == "b" and not (out / ".prepare").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    assert "1 other file(s)" in one_line(["--input", str(a), "--out", str(tmp_path / "notes"), "--no-progress"], capsys)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "/no/such/dir"], r"input '/no/such/dir' does not exist; valid: 'embedded', \.txt"),
        (["--input", "{tmp}/x.csv"], r"x\.csv' is not a known kind of file"),
        (["--input", "{tmp}/t.txt", "--val-fraction", "1.5"], r"val_fraction=1\.5 must lie strictly between 0 and 1"),
        (["--input", "{tmp}/t.txt", "--tokenizer", "wordpiece"], r"--tokenizer 'wordpiece' does not exist"),
        (["--input", "{tmp}/t.txt", "--workers", "-1"], r"--workers=-1"),
        (["--input", "{tmp}/bad.jsonl"], r"bad\.jsonl' line 2 is not JSON"),
        (["--input", "{tmp}/nokey.jsonl"], r"nokey\.jsonl' line 1 has no string 'text'; valid keys: \['body'\]"),
        (["--input", "{tmp}/t.txt", "--out", "{tmp}/t.txt/sub"], r"lies under .*t\.txt', which is a file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args: list[str], message: str):
    (tmp_path / "t.txt").write_text("some text\n" * 50)
    (tmp_path / "x.csv").write_text("a,b\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{not json\n')
    (tmp_path / "nokey.jsonl").write_text('{"body": "no text key"}\n')
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    err = one_line([*args, "--no-progress"], capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


def test_a_shard_of_odd_length_or_with_ids_beyond_the_vocabulary_is_named(tmp_path: Path):
    docs = documents(60)
    prepare("--input", str(write_corpus(tmp_path / "c", docs)), "--out", str(tmp_path / "s"), "--workers", "0")
    meta = read_meta(tmp_path / "s")
    shard = tmp_path / "s" / meta.files["val"][0]["file"]
    data = shard.read_bytes()
    shard.write_bytes(data + b"\x00")
    with pytest.raises(ValueError, match=rf"{shard.name}' has {len(data) + 1} bytes, not a whole number of uint16"):
        open_split(tmp_path / "s", "val")
    shard.write_bytes(data[:-2] + (300).to_bytes(2, "little"))  # a byte shard holding id 300
    from datamodules.text.shard_windows import SplitWindows

    windows = SplitWindows(tmp_path / "s", "val", seq_len=8)
    with pytest.raises(ValueError, match=r"token id 300 in the val split .* is beyond vocab_size=256"):
        windows[len(windows) - 1]
    meta_path = tmp_path / "s" / "meta.json"
    meta_path.write_text(meta_path.read_text().replace('"max_token_id": 255', '"max_token_id": 300'))
    with pytest.raises(ValueError, match=r"hold token id 300, beyond vocab_size=256"):
        open_split(tmp_path / "s", "train")
