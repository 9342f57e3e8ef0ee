"""Offline text corpora: the embedded default and user text files.

The embedded corpus never touches the network (DESIGN.md section 5):

    `bible` on PATH ?  --yes-->  King James Bible (Debian bible-kjv), verse references stripped
                       --no--->  CPython's pydoc_data.topics (ships with every interpreter)

User corpora are a UTF-8 text file, or a directory whose .txt/.md files are read in sorted
order so the same directory always gives the same token stream.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import NamedTuple

BIBLE_COMMAND = "bible"
BIBLE_RANGE = "Gen1:1-Rev22:21"
BIBLE_NAME = "bible-kjv"
PYDOC_NAME = "pydoc-topics"
TEXT_SUFFIXES = (".txt", ".md")

# `bible -f` starts every line with a verse reference such as "Ge1:1 " or "1Cor13:4 ".
_VERSE_REFERENCE = re.compile(r"^[1-3]?[A-Za-z]+\d+:\d+ ", re.MULTILINE)


class Corpus(NamedTuple):
    """A text corpus and the name it is recorded under (meta.json, hparams, logs)."""

    text: str
    name: str


def embedded_corpus_name() -> str:
    """Names the corpus `load_embedded_corpus` will return, without reading it."""
    return BIBLE_NAME if shutil.which(BIBLE_COMMAND) else PYDOC_NAME


def strip_verse_references(text: str) -> str:
    """Removes the leading `Book<chapter>:<verse> ` reference from every line."""
    return _VERSE_REFERENCE.sub("", text)


def _read_bible() -> str:
    """Runs `bible -f "Gen1:1-Rev22:21"` and returns the verses, one per line, unreferenced."""
    exe = shutil.which(BIBLE_COMMAND)
    if exe is None:
        raise FileNotFoundError(f"command {BIBLE_COMMAND!r} is not on PATH")
    result = subprocess.run(
        [exe, "-f", BIBLE_RANGE], capture_output=True, check=True, timeout=120, text=True, encoding="utf-8"
    )
    text = strip_verse_references(result.stdout).strip()
    if not text:
        raise ValueError(f"{exe} -f {BIBLE_RANGE!r} printed no text (is bible-kjv-text installed?)")
    return text + "\n"


def _read_pydoc_topics() -> str:
    """Joins CPython's help-topic texts, in sorted topic order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics)) + "\n"


def load_embedded_corpus() -> Corpus:
    """Loads the embedded default corpus.

    Returns:
        (text, name): the KJV Bible as "bible-kjv" when the `bible` command exists, otherwise the
        pydoc topics as "pydoc-topics". A `bible` command that exists but fails falls back too,
        with a warning, so the suite always has a corpus.
    """
    if shutil.which(BIBLE_COMMAND) is not None:
        try:
            return Corpus(_read_bible(), BIBLE_NAME)
        except (OSError, ValueError, subprocess.SubprocessError) as err:
            warnings.warn(f"embedded corpus: `bible` failed ({err}); using {PYDOC_NAME}", stacklevel=2)
    return Corpus(_read_pydoc_topics(), PYDOC_NAME)


def _decode(path: Path) -> str:
    """Reads one file as strict UTF-8 with a one-line error naming the file."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"text file {str(path)!r} is not valid UTF-8 (bad byte at offset {err.start}); "
            "text corpora must be UTF-8 encoded"
        ) from None


def list_text_files(directory: Path) -> list[Path]:
    """Lists the .txt/.md files under `directory` (recursively), sorted by relative path."""
    files = [p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES]
    return sorted(files, key=lambda p: p.relative_to(directory).as_posix())


def read_text_path(path: str | Path) -> str:
    """Reads a UTF-8 text file, or every .txt/.md file of a directory joined by blank lines.

    Args:
        path: A text file, or a directory searched recursively for .txt and .md files.

    Returns:
        The text, identical for identical inputs (files are taken in sorted relative-path order).

    Raises:
        FileNotFoundError: The path does not exist.
        ValueError: A file is not UTF-8, the directory holds no .txt/.md files, or the text is empty.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"text source {str(path)!r} does not exist; pass 'embedded', a UTF-8 text file, "
            "or a directory of .txt/.md files"
        )
    if path.is_dir():
        files = list_text_files(path)
        if not files:
            raise ValueError(f"text directory {str(path)!r} holds no .txt or .md files")
        text = "\n\n".join(_decode(f) for f in files)
    else:
        text = _decode(path)
    if not text.strip():
        raise ValueError(f"text source {str(path)!r} is empty (only whitespace); it needs some text")
    return text


def load_corpus(source: str) -> Corpus:
    """Loads `source`: "embedded", a text file, or a directory of .txt/.md files.

    Returns:
        (text, name) where name is the embedded corpus name or the file/directory stem.
    """
    if source == "embedded":
        return load_embedded_corpus()
    return Corpus(read_text_path(source), Path(source).resolve().stem or "corpus")
