"""Ranks that read different data are refused at setup, in one line naming both (issue 43): the fingerprint of a
prepared corpus differs between two versions of the corpus and not between two preparations of one; the ranks
compare fingerprints in a real gloo group (every rank raises, none waits); TextDataModule.setup runs the check."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from pydoc_data.topics import topics

import pytest

import datamodules.fingerprint as fp
from datamodules.text.datamodule import TextDataModule
from datamodules.text.shards import META_FILE

ROOT = Path(__file__).resolve().parents[2]
TEXT = "\n\n".join(topics[k] for k in sorted(topics))[:60_000]
SMALL = {"seq_len": 32, "batch_size": 4, "train_samples_per_epoch": 64, "eval_samples": 16}


def prepared(node: Path, text: str, data_dir: str = "data") -> TextDataModule:
    """A node's corpus file and its prepared cache (the same relative paths on every node)."""
    node.mkdir(parents=True, exist_ok=True)
    if not (node / "topics.txt").is_file():  # prepared again: the same file, untouched
        (node / "topics.txt").write_text(text)
    dm = TextDataModule(source=str(node / "topics.txt"), data_dir=str(node / data_dir), **SMALL)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def fingerprint(dm: TextDataModule) -> str:
    meta = dm._meta
    shards = {seg["file"] for split in meta.split_tokens for seg in meta.segments(split)}
    return fp.files_fingerprint(dm.shard_dir, [META_FILE, *shards])


def test_two_versions_of_a_corpus_differ_and_two_preparations_of_one_agree(tmp_path: Path):
    v1 = prepared(tmp_path / "a", TEXT)
    again = prepared(tmp_path / "a", TEXT, data_dir="data-again")  # the same corpus prepared again
    edited = TEXT[:30_000] + TEXT[30_000:30_100].upper() + TEXT[30_100:]  # one paragraph, same length
    v2 = prepared(tmp_path / "b", edited)
    assert fingerprint(v1) == fingerprint(again)
    assert fingerprint(v1) != fingerprint(v2)
    assert len(fingerprint(v1)) == 64 and v1.data_fingerprint is None  # alone: not computed, nothing read


def test_a_large_shard_is_sampled_from_its_first_byte_to_its_last(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(fp, "WHOLE_BYTES", 1024)  # so a 64 KiB file counts as large
    data = bytearray(os.urandom(65_536))
    (tmp_path / "x.bin").write_bytes(data)
    before = fp.files_fingerprint(tmp_path, ["x.bin"])
    for position in (0, len(data) - 1):  # the first and the last block are always read
        changed = bytearray(data)
        changed[position] ^= 1
        (tmp_path / "x.bin").write_bytes(changed)
        assert fp.files_fingerprint(tmp_path, ["x.bin"]) != before
    (tmp_path / "x.bin").write_bytes(data + b"\0")  # a size change, whatever the blocks
    assert fp.files_fingerprint(tmp_path, ["x.bin"]) != before


def two_ranks(monkeypatch, other: dict) -> None:
    """This process as rank 1 of 2, rank 0's record being ``other`` (all_gather_object faked)."""
    monkeypatch.setattr(fp, "_world", lambda: 2)
    monkeypatch.setattr(fp.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(fp.dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), [other, mine]))


def test_setup_refuses_a_rank_whose_shards_differ_in_one_line_naming_both(tmp_path: Path, monkeypatch):
    v1, v2 = prepared(tmp_path / "a", TEXT), prepared(tmp_path / "b", TEXT.replace("the", "teh", 1))
    first = {"rank": 0, "host": "node-a", "what": f"text shards {v1.shard_dir}", "fingerprint": fingerprint(v1)}
    two_ranks(monkeypatch, first)
    with pytest.raises(ValueError) as refused:
        v2.setup("fit")
    assert str(refused.value) == (
        f"the ranks read different data: rank 0 on node-a read text shards {v1.shard_dir} (fingerprint "
        f"{fingerprint(v1)[:12]}), rank 1 on {socket.gethostname()} read text shards {v2.shard_dir} (fingerprint "
        f"{fingerprint(v2)[:12]}); valid: the same data on every node (copy rank 0's to {socket.gethostname()}, "
        "or prepare both from the same corpus)"
    )
    again = prepared(tmp_path / "a", TEXT, data_dir="data-again")  # rank 0: the same corpus, its own preparation
    first["fingerprint"] = fingerprint(again)
    v1.setup("fit")  # taken
    assert v1.data_fingerprint == fingerprint(again) == fingerprint(v1)


def test_every_rank_of_a_real_gloo_group_refuses_different_data(tmp_path: Path):
    """Two processes: first each with its own fingerprint (both refuse, in the same line: neither is left waiting in
    a collective), then with the same one (both go on)."""
    command = [sys.executable, "-m", "tests.datamodules.fingerprint_ranks"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([*command, str(rank), "2", str(tmp_path / "store"), first, "c" * 64], cwd=ROOT, env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank, first in enumerate(["a" * 64, "b" * 64])]  # fmt: skip
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    lines = set()
    for code, out, err in results:
        assert code == 2 and out == "same\n" and err.count("\n") == 1, (out, err)
        lines.add(err)
    (line,) = lines  # the same line on both ranks
    assert line.startswith("error: the ranks read different data: rank 0 on "), line
    assert "read text shards /data/text/corpus (rank 0's copy) (fingerprint aaaaaaaaaaaa), rank 1 on " in line
    assert "(rank 1's copy) (fingerprint bbbbbbbbbbbb); valid: the same data on every node (copy rank 0's to " in line
