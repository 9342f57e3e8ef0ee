"""Fixtures shared by the task tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.experiments.parsers import built_once


@pytest.fixture(scope="session", autouse=True)
def cli_parsers_built_once():
    """Every in-process command reuses its CLI class's parser (see tests/experiments/parsers.py)."""
    with built_once():
        yield


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """A small UTF-8 corpus (fast to tokenize) and a shard cache directory shared by every test
    (read-only: a test that changes shards makes its own)."""
    import pydoc_data.topics

    root = tmp_path_factory.mktemp("text")
    text = root / "corpus.txt"
    text.write_text("".join(pydoc_data.topics.topics.values())[:200_000])
    return text, root / "shards"


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 64 MiB tmpfs to fill for real (needs the right to mount: root, as in CI containers); skipped with the
    reason otherwise."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        reason = getattr(err, "stderr", b"") or str(err).encode()
        pytest.skip(f"cannot mount a tmpfs here to fill a disk for real: {reason.decode().strip()[:200]}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
