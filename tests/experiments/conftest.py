"""Fixtures shared by the task tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """A small UTF-8 corpus (fast to tokenize) and a shard cache directory shared by the module."""
    import pydoc_data.topics

    root = tmp_path_factory.mktemp("text")
    text = root / "corpus.txt"
    text.write_text("".join(pydoc_data.topics.topics.values())[:200_000])
    return text, root / "shards"
