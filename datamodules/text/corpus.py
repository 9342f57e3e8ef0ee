"""Offline text corpora: the embedded default, user text files, and web-scale document collections.

The embedded corpus never touches the network:

    `bible` on PATH ?  --yes-->  King James Bible (Debian bible-kjv), verse references stripped
                       --no--->  CPython's pydoc_data.topics (ships with every interpreter)

User corpora are files or directories (searched recursively, taken in sorted relative-path order, so the
same directory always gives the same token stream), streamed document by document, never read whole:

    .txt .md                         one document per file (read in pieces cut at line starts)
    .jsonl .jsonl.gz .jsonl.zst      one document per line: the string under ``text_key`` ("text")
    .parquet                         one document per row: the string column ``text_key`` (FineWeb-Edu's layout)

Every document carries a 64-bit key, a hash of its text, that decides its split (train / val / test), so the
split is deterministic, independent of file order and worker count, and a document repeated in the corpus
always lands in the same split.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import shutil
import subprocess
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from datamodules.text.compressed import check_zstd_frames, open_decompressed
from fileio.checks import utf8_text

BIBLE_COMMAND = "bible"
BIBLE_RANGE = "Gen1:1-Rev22:21"
BIBLE_NAME = "bible-kjv"
PYDOC_NAME = "pydoc-topics"
TEXT_SUFFIXES = (".txt", ".md")
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
PIECE_CHARS = 1 << 20  # a text file is tokenized in pieces of about 1M characters, cut at line starts

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


##################################################################################
#                    Streaming inputs: files of documents                        #
##################################################################################

# A piece boundary inside a text document: a newline followed by a non-space, so no whitespace run or word is
# ever cut in two (byte-level pre-tokenization would split it differently): pieces tokenize as the whole does.
_PIECE_BOUNDARY = re.compile(r"\n(?=\S)")


@dataclass(frozen=True)
class InputFile:
    """One input file: where it is, how its documents are stored, and its size on disk."""

    path: Path
    kind: str  # "text", "jsonl" or "parquet"
    size: int


@dataclass(frozen=True)
class Piece:
    """Text of one document (all of it, or one piece of a long text file) and the document's split key."""

    text: str
    key: int  # 64-bit hash of the whole document's text: decides its split
    end: bool  # the last piece of its document (an end-of-document token follows it)


def input_kind(path: Path) -> str | None:
    """ "text", "jsonl", "parquet", or None for a file the reader does not take."""
    name = path.name.lower()
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if name.endswith(RECORD_SUFFIXES[:3]):
        return "jsonl"
    return "parquet" if name.endswith(".parquet") else None


def list_inputs(sources: Sequence[str | Path]) -> list[InputFile]:
    """Every input file of ``sources`` (files, or directories searched recursively), in a fixed order.

    Raises:
        FileNotFoundError: a source does not exist.
        ValueError: a file of an unknown kind, or no input file at all (one line, naming the path).
    """
    valid = "valid: 'embedded', .txt .md .jsonl .jsonl.gz .jsonl.zst .parquet files or directories of them"
    found: list[InputFile] = []
    for source in sources:
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"input {str(path)!r} does not exist; {valid}")
        if path.is_dir():
            files = sorted((p for p in path.rglob("*") if p.is_file() and input_kind(p)),
                           key=lambda p: p.relative_to(path).as_posix())  # fmt: skip
            if not files:
                raise ValueError(f"input directory {str(path)!r} holds no input files; {valid}")
        elif input_kind(path) is None:
            raise ValueError(f"input {str(path)!r} is not a known kind of file; {valid}")
        else:
            files = [path]
        found += [InputFile(f, input_kind(f), f.stat().st_size) for f in files]  # type: ignore[arg-type]
    for item in found:  # a .zst cut short is refused now, before anything is written (a seek per block)
        if item.path.name.lower().endswith(".zst"):
            check_zstd_frames(item.path)
    if not found:
        raise ValueError(f"no input given; {valid}")
    return found


def document_key(text: str) -> int:
    """The 64-bit split key of a document: blake2b of its UTF-8 text."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def iter_pieces(item: InputFile, text_key: str = "text", skip: int = 0) -> Iterator[tuple[Piece, int]]:
    """The pieces of an input file in order, each with how many bytes of the file are consumed after it.

    Args:
        item: the file.
        text_key: the JSON key / parquet column holding the text.
        skip: pieces already done (a resumed preparation re-reads them without yielding them).
    """
    reader = {"text": _text_pieces, "jsonl": _jsonl_pieces, "parquet": _parquet_pieces}[item.kind]
    for index, (piece, position) in enumerate(reader(item, text_key)):
        if index >= skip:
            yield piece, position


def _text_key_of_file(path: Path) -> int:
    digest = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return int.from_bytes(digest.digest(), "little")


def _text_pieces(item: InputFile, text_key: str) -> Iterator[tuple[Piece, int]]:
    key = _text_key_of_file(item.path)  # the document's key must be known before its first piece goes out
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    buffer, consumed = "", 0
    with open(item.path, "rb") as fh:
        while True:
            block = fh.read(PIECE_CHARS)
            try:
                buffer += decoder.decode(block, final=not block)
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"text file {str(item.path)!r} is not valid UTF-8 (bad byte at offset {consumed + err.start}); "
                    "text corpora must be UTF-8 encoded"
                ) from None
            consumed += len(block)
            while len(buffer) > PIECE_CHARS and (cut := _PIECE_BOUNDARY.search(buffer, PIECE_CHARS)):
                yield Piece(buffer[: cut.end()], key, end=False), consumed
                buffer = buffer[cut.end() :]
            if not block:
                break
    yield Piece(buffer, key, end=True), consumed


def _jsonl_pieces(item: InputFile, text_key: str) -> Iterator[tuple[Piece, int]]:
    stream, raw = open_decompressed(item.path)
    kind = next((s for s in RECORD_SUFFIXES if item.path.name.lower().endswith(s)), ".jsonl")
    try:
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as err:  # RecursionError: nested past what json reads
                reason = "nested too deeply" if isinstance(err, RecursionError) else str(err).splitlines()[0][:100]
                raise ValueError(f"{str(item.path)!r} line {number} is not JSON ({reason})") from None
            text = record.get(text_key) if isinstance(record, dict) else None
            if not isinstance(text, str):
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise ValueError(f"{str(item.path)!r} line {number} has no string {text_key!r}; valid keys: {keys}")
            utf8_text(text, f"{str(item.path)!r} line {number} {text_key!r}")  # a "\udcff" escape is no text
            yield Piece(text, document_key(text), end=True), raw.tell()
    except FileNotFoundError:
        raise
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(item.path)!r} cannot be decompressed ({err}); valid: a complete {kind} file") from None
    except Exception as err:  # noqa: BLE001 - zstandard.ZstdError: blocks whose bytes are not zstd data
        if type(err).__name__ != "ZstdError":
            raise
        raise ValueError(f"{str(item.path)!r} is corrupt ({err}); valid: a complete .jsonl.zst file") from None
    finally:
        stream.close()
        raw.close()


def _parquet_pieces(item: InputFile, text_key: str) -> Iterator[tuple[Piece, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(item.path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not parquet
        raise ValueError(f"{str(item.path)!r} is not a readable parquet file ({err})") from None
    columns = table.schema_arrow.names
    if text_key not in columns:
        raise ValueError(f"{str(item.path)!r} has no column {text_key!r}; valid columns: {columns}")
    kind = table.schema_arrow.field(text_key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        strings = [n for n in columns if pa.types.is_string(table.schema_arrow.field(n).type)]
        raise ValueError(
            f"{str(item.path)!r} column {text_key!r} holds {kind}, not text; "
            f"valid: --text-key naming a string column ({', '.join(strings) or 'it has none'})"
        )
    rows, done = max(1, table.metadata.num_rows), 0
    for batch in table.iter_batches(batch_size=1024, columns=[text_key]):
        for text in batch.column(0).to_pylist():
            done += 1
            if text is None:
                continue
            yield Piece(text, document_key(text), end=True), item.size * done // rows
