"""Issue #36, concurrency: two ``prepare_text`` into one ``--out``, two ``latents.encode`` into one cache: one
wins and writes the whole output, the other stops in one line (exit 2) naming the first, and nothing that
existed before changes.

The second command is a real process (the command line a user types), started while the first provably holds
the output: the first runs in this process, paused inside its work until the second has answered."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import datamodules.latents.encode as encode_module
import datamodules.text.prepare as prepare_module
from datamodules.latents.cache import LatentShards
from datamodules.text.shards import SPLITS, open_split, read_meta
from models.vae import build_vae

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def command(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """A corpus, and a file of the user's beside where the output goes."""
    import pydoc_data.topics

    (tmp_path / "corpus.txt").write_text("".join(pydoc_data.topics.topics.values())[:50_000])
    (tmp_path / "notes.txt").write_text("mine")
    return tmp_path


def check_shards(out: Path) -> None:
    meta = read_meta(out)
    assert sum(len(open_split(out, split)) for split in SPLITS) == meta.num_tokens > 0


def test_a_second_prepare_text_into_one_out_stops_and_the_first_finishes_whole(corpus_dir, monkeypatch, capsys):
    out = corpus_dir / "shards"
    args = ["--input", str(corpus_dir / "corpus.txt"), "--out", str(out), "--tokenizer", "byte", "--workers", "1",
            "--no-progress"]  # fmt: skip
    before = tree_hashes(corpus_dir)
    second: list[subprocess.CompletedProcess] = []
    real = prepare_module.prepare_corpus

    def the_second_arrives_meanwhile(*a, **k):
        second.append(command("datamodules.text.prepare", *args))
        return real(*a, **k)

    monkeypatch.setattr(prepare_module, "prepare_corpus", the_second_arrives_meanwhile)
    prepare_module.main(args)
    line = one_error_line(second[0])
    assert line.startswith(f"error: --out {str(out)!r} is being written by prepare_text (pid {os.getpid()} on ")
    assert line.endswith("valid: wait for it to end (the same command then finds it done), stop it, or another --out")
    assert capsys.readouterr().out.startswith(f"wrote {out}: corpus=")
    check_shards(out)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no lock, no staging left
    assert {k: v for k, v in tree_hashes(corpus_dir).items() if not k.startswith("shards/")} == before
    # Afterwards the same command finds the output done, and leaves every file of it as it is.
    done = tree_hashes(out)
    proc = command("datamodules.text.prepare", *args)
    assert proc.returncode == 0 and "already prepared with these inputs and settings" in proc.stdout, proc.stderr
    assert tree_hashes(out) == done


def test_two_prepare_text_started_together_write_one_whole_output(corpus_dir):
    """No pacing: whichever gets the lock writes; the other either stops in one line or, arriving after the
    first finished, finds the output done. Never two writes, never a mixed set."""
    out = corpus_dir / "shards"
    argv = [sys.executable, "-m", "datamodules.text.prepare", "--input", str(corpus_dir / "corpus.txt"),
            "--out", str(out), "--tokenizer", "byte", "--workers", "1", "--no-progress"]  # fmt: skip
    procs = [subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    wrote = [r for r in results if r[0] == 0 and r[1].startswith(f"wrote {out}")]
    assert len(wrote) == 1, results
    (other,) = [r for r in results if r is not wrote[0]]
    if other[0] == 2:
        assert other[2].strip().startswith(f"error: --out {str(out)!r} is being written by prepare_text"), other
    else:
        assert other[0] == 0 and "already prepared" in other[1], other
    check_shards(out)


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    vae = build_vae([8, 16], layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16)
    path = tmp_path_factory.mktemp("vae")
    vae.save_pretrained(path)
    return path


@pytest.mark.slow  # the second command is a process that imports torch and diffusers (seconds)
def test_a_second_encode_into_one_cache_stops_before_loading_the_vae(vae_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cache"
    args = ["--vae", str(vae_dir), "--out", str(out), "--image-size", "16", "--limit", "24", "--batch-size", "12",
            "--shard-size", "16", "--no-flip", "--device", "cpu"]  # fmt: skip
    before = tree_hashes(vae_dir)
    second: list[subprocess.CompletedProcess] = []
    real = encode_module.encode_batch

    def the_second_arrives_meanwhile(*a, **k):
        if not second:  # while the first holds the cache, one shard not yet written
            second.append(command("datamodules.latents.encode", *args))
        return real(*a, **k)

    monkeypatch.setattr(encode_module, "encode_batch", the_second_arrives_meanwhile)
    assert encode_module.main(args) == 0
    line = one_error_line(second[0])
    assert line.startswith(f"error: --out {str(out)!r} is being written by latents.encode (pid {os.getpid()} on ")
    assert line.endswith("valid: wait for it to end (the same command then finds the cache), stop it, or another --out")
    assert "wrote 24 latents" in capsys.readouterr().out
    shards = LatentShards(out)
    assert len(shards) == 24 and np.isfinite(shards.latent(23)).all()
    assert not (out / encode_module.LOCK_FILE).exists() and not (out / encode_module.PROGRESS_FILE).exists()
    assert tree_hashes(vae_dir) == before
    done = tree_hashes(out)
    assert encode_module.main(args) == 0  # afterwards: the cache is found, every file left as it is
    assert capsys.readouterr().out.startswith(f"cache exists: {out}")
    assert tree_hashes(out) == done


def test_a_refused_encode_leaves_no_directory_behind(tmp_path, capsys):
    """The lock comes before the VAE is read: a command refused after it (no VAE there) removes the directory it
    made for the lock, and with it everything it created."""
    out = tmp_path / "cache"
    assert encode_module.main(["--vae", str(tmp_path / "no-vae"), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not out.exists()
