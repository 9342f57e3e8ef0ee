"""Text corpus readers: the embedded corpus, its pydoc fallback, user files and their errors."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from pydoc_data.topics import topics

import pytest

from datamodules.text.corpus import (
    BIBLE_NAME,
    PYDOC_NAME,
    embedded_corpus_name,
    load_corpus,
    load_embedded_corpus,
    read_text_path,
    strip_verse_references,
)

VERSE_REF = re.compile(r"^[1-3]?[A-Za-z]+\d+:\d+ ", re.MULTILINE)


def test_strip_verse_references_matches_hand_written_lines() -> None:
    raw = "Ge1:1 In the beginning.\n1Cor13:4 Charity suffereth long.\nSSol2:1 I am the rose: 3:16 stays.\n"
    assert strip_verse_references(raw) == "In the beginning.\nCharity suffereth long.\nI am the rose: 3:16 stays.\n"


def test_embedded_corpus_loads_and_names_itself() -> None:
    corpus = load_embedded_corpus()
    assert corpus.name == embedded_corpus_name()
    assert len(corpus.text) > 100_000
    if corpus.name == BIBLE_NAME:
        assert corpus.text.startswith("In the beginning God created the heaven and the earth.\n")
        assert corpus.text.rstrip().endswith("The grace of our Lord Jesus Christ be with you all. Amen.")
        assert VERSE_REF.search(corpus.text) is None  # every reference stripped
        assert corpus.text.count("\n") == 31102  # one line per verse
    else:
        assert corpus.name == PYDOC_NAME


@pytest.mark.skipif(shutil.which("bible") is None, reason="Debian bible-kjv is not installed")
def test_bible_is_the_default_when_installed() -> None:
    assert embedded_corpus_name() == BIBLE_NAME


def test_pydoc_fallback_when_bible_is_absent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH directory: no `bible`
    assert embedded_corpus_name() == PYDOC_NAME
    corpus = load_embedded_corpus()
    assert corpus.name == PYDOC_NAME
    for key in sorted(topics)[:5] + ["if"]:
        assert topics[key].strip() in corpus.text
    assert load_embedded_corpus().text == corpus.text  # deterministic


def test_broken_bible_command_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bible"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.warns(UserWarning, match="bible"):
        corpus = load_embedded_corpus()
    assert corpus.name == PYDOC_NAME


def test_read_text_file_and_directory_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.md").write_text("first")
    (tmp_path / "sub" / "c.txt").write_text("third")
    (tmp_path / "skip.bin").write_bytes(b"\xff\xfe")
    assert read_text_path(tmp_path / "b.txt") == "second"
    assert read_text_path(tmp_path) == "first\n\nsecond\n\nthird"
    assert load_corpus(str(tmp_path / "b.txt")).name == "b"
    assert load_corpus(str(tmp_path)).name == tmp_path.name


def test_missing_path_names_it_and_lists_what_is_valid(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))) as info:
        read_text_path(missing)
    assert "embedded" in str(info.value) and ".txt/.md" in str(info.value)
    assert "\n" not in str(info.value)


def test_empty_corpus_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "blank.txt"
    empty.write_text("  \n\t\n")
    with pytest.raises(ValueError, match=r"blank\.txt.*empty"):
        read_text_path(empty)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds no \.txt or \.md files"):
        read_text_path(tmp_path / "d")


def test_undecodable_file_names_the_file_and_offset(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt.*not valid UTF-8 \(bad byte at offset 3\)"):
        read_text_path(bad)
