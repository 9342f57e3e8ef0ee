"""What data a run reads, as one hash, and the check that every rank of a multi-process run reads the same data.

    fingerprint = files_fingerprint(shard_dir, ["meta.json", "tokens-00000.bin"])   # sha256 hex
    same_data_on_every_rank(fingerprint, f"text shards {shard_dir}")               # ValueError naming both

Ranks on different nodes read their own copy of a cache (``data/text/<corpus>-...``); a node holding another
version of the corpus under the same path would train its ranks on other data, silently. Every DataModule hashes
what its split files are at ``setup`` and the ranks compare hashes there (``all_gather_object`` over the default
process group, when one is initialized with more than one rank), so the mismatch is one line naming both ranks,
their hosts and the path, on every rank at once (none of them waits in a later collective), before training.

The hash covers each file's name and size, small files (the metadata, which records the preparation's inputs,
their sizes and times, and the tokenizer's hash) whole, and of a large file ``SAMPLES`` evenly spaced blocks of
``SAMPLE_BYTES``: milliseconds for a corpus of any size; an edit that keeps every size and every sampled block
(and a metadata file that records the same inputs) is not seen.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterable
from pathlib import Path

import torch.distributed as dist

WHOLE_BYTES = 1 << 20  # files up to 1 MiB (meta.json, tokenizers, label arrays) are hashed whole
SAMPLES = 64  # blocks read from a larger file, evenly spaced from its first byte to its last
SAMPLE_BYTES = 4096
BUDGET_BYTES = 16 << 20  # at most about this much sampled over all large files (a corpus of thousands of shards)


def files_fingerprint(root: str | Path, names: Iterable[str]) -> str:
    """sha256 (hex) of the named files under ``root``: each name and size, small files whole, large ones sampled.

    Raises:
        FileNotFoundError: a named file is missing (its path in the message).
    """
    digest = hashlib.sha256()
    sizes = {name: (Path(root) / name).stat().st_size for name in sorted(set(names))}
    large = sum(size > WHOLE_BYTES for size in sizes.values())
    samples = max(2, min(SAMPLES, BUDGET_BYTES // (SAMPLE_BYTES * max(1, large))))
    for name, size in sizes.items():
        digest.update(f"{name}\0{size}\0".encode())
        with open(Path(root) / name, "rb") as f:
            if size <= WHOLE_BYTES:
                digest.update(f.read())
                continue
            for k in range(samples):
                f.seek((size - SAMPLE_BYTES) * k // (samples - 1))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def items_fingerprint(items: Iterable[str]) -> str:
    """sha256 (hex) of a set of lines, e.g. an image folder's ``<relative path> <class> <size>`` per image: what a
    DataModule of many small files reads, without opening one of them."""
    digest = hashlib.sha256()
    for item in sorted(items):
        digest.update(item.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def _world() -> int:
    """Ranks in the default process group (1 when none is initialized)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def first_mismatch(records: list[dict]) -> str | None:
    """The one-line complaint about the first rank whose fingerprint differs from rank 0's (None: all agree).
    ``records``: per rank, ``{"rank", "host", "what", "fingerprint"}`` as :func:`same_data_on_every_rank`
    gathers them."""
    first = records[0]
    other = next((r for r in records if r["fingerprint"] != first["fingerprint"]), None)
    if other is None:
        return None

    def side(r: dict) -> str:
        return f"rank {r['rank']} on {r['host']} read {r['what']} (fingerprint {r['fingerprint'][:12]})"

    return (
        f"the ranks read different data: {side(first)}, {side(other)}; valid: the same data on every node "
        f"(copy rank {first['rank']}'s to {other['host']}, or prepare both from the same corpus)"
    )


def check_same_files(root: str | Path, names: Iterable[str], what: str) -> str | None:
    """Under a process group of two or more ranks: the files' fingerprint, checked to be the same on every rank
    (:func:`same_data_on_every_rank`); alone, nothing is read and None is returned."""
    if _world() < 2:
        return None
    fingerprint = files_fingerprint(root, names)
    same_data_on_every_rank(fingerprint, what)
    return fingerprint


def check_same_items(items: Iterable[str], what: str) -> str | None:
    """:func:`check_same_files` for a DataModule of many files, fingerprinted by :func:`items_fingerprint` (the
    items are not even listed when the run is alone)."""
    if _world() < 2:
        return None
    fingerprint = items_fingerprint(items)
    same_data_on_every_rank(fingerprint, what)
    return fingerprint


def same_data_on_every_rank(fingerprint: str, what: str) -> None:
    """Compares ``fingerprint`` across the ranks of the default process group (a no-op without one, or alone).

    Every rank takes part (it is a collective: call it on every rank, at the same point) and every rank raises
    the same error, so none is left waiting for the others.

    Raises:
        ValueError: the fingerprints differ: rank 0's and the first other one's, with their hosts and ``what``.
    """
    world = _world()
    if world < 2:
        return
    mine = {"rank": dist.get_rank(), "host": socket.gethostname(), "what": what, "fingerprint": fingerprint}
    records: list[dict | None] = [None] * world
    dist.all_gather_object(records, mine)
    if (line := first_mismatch(records)) is not None:
        raise ValueError(line)


__all__ = [
    "check_same_files",
    "check_same_items",
    "files_fingerprint",
    "first_mismatch",
    "items_fingerprint",
    "same_data_on_every_rank",
]
