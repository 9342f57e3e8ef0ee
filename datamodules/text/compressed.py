"""Compressed inputs (.gz, .zst) read to their end, or refused: a file cut short never passes for a shorter corpus.

    .gz    gzip checks its end-of-stream marker itself: a truncated member raises EOFError while reading
    .zst   zstandard's stream reader ends quietly where the file ends, even inside a frame, so the frame
           structure is walked first (headers and block sizes only, seeking over the data: a second for
           tens of GB): every frame must end with its last block, and the file with a frame

    zstd frame:  magic FD2FB528 | header (2-14 B) | block | block | ... | last block | [checksum 4 B]
    block:       3-byte header (bit 0: last, bits 1-2: type, bits 3-23: size) + size bytes (RLE: 1 byte)
    skippable:   magic 184D2A5? | 4-byte size | size bytes

Format: RFC 8878 (Zstandard Compression and the application/zstd Media Type), section 3.1.
"""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from typing import BinaryIO

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50
RLE_BLOCK, RESERVED_BLOCK = 1, 3


def _read(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError(f"the file ends inside {what} (cut short)")
    return data


def _frame(f: BinaryIO, size: int) -> None:
    """Walks one zstd frame after its magic number, leaving ``f`` at the byte after it."""
    descriptor = _read(f, 1, "a frame header")[0]
    fcs_flag, single_segment = descriptor >> 6, bool(descriptor & 0x20)
    if descriptor & 0x08:
        raise ValueError("a frame header sets a reserved bit (not zstd data)")
    dictionary = (0, 1, 2, 4)[descriptor & 0x03]
    content_size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    _read(f, (0 if single_segment else 1) + dictionary + content_size, "a frame header")
    while True:
        header = int.from_bytes(_read(f, 3, "a block header"), "little")
        last, kind, length = header & 1, (header >> 1) & 3, header >> 3
        if kind == RESERVED_BLOCK:
            raise ValueError("a block of the reserved type (not zstd data)")
        skip = 1 if kind == RLE_BLOCK else length
        if f.tell() + skip > size:
            raise EOFError("the file ends inside a block (cut short)")
        f.seek(skip, os.SEEK_CUR)
        if last:
            break
    if descriptor & 0x04:  # content checksum
        _read(f, 4, "a frame checksum")


def check_zstd_frames(path: str | Path) -> int:
    """Checks that ``path`` is a whole zstd stream: frames end with their last block and the file with a frame.

    Returns:
        The number of frames.

    Raises:
        ValueError: one line naming the file: cut short, empty, or not zstd data.
    """
    path = Path(path)
    size, frames = path.stat().st_size, 0
    try:
        with open(path, "rb") as f:
            while f.tell() < size:
                magic = int.from_bytes(_read(f, 4, "a frame's magic number"), "little")
                if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
                    f.seek(int.from_bytes(_read(f, 4, "a skippable frame"), "little"), os.SEEK_CUR)
                    if f.tell() > size:
                        raise EOFError("the file ends inside a skippable frame (cut short)")
                    continue
                if magic != ZSTD_MAGIC:
                    where = "does not start" if frames == 0 else f"has bytes after frame {frames} that do not start"
                    raise ValueError(f"{where} with zstd's magic number (not zstd data)")
                _frame(f, size)
                frames += 1
    except (EOFError, ValueError) as err:
        raise ValueError(f"{str(path)!r} is not a complete zstd file: {err}; valid: a whole .jsonl.zst file") from None
    if frames == 0:
        raise ValueError(f"{str(path)!r} holds no zstd frame (empty); valid: a whole .jsonl.zst file")
    return frames


def open_decompressed(path: Path) -> tuple[BinaryIO, BinaryIO]:
    """(decompressed stream, the raw file whose ``tell()`` says how far into the file the reader is).

    A .zst file is checked whole first (:func:`check_zstd_frames`) and then read frame after frame; a .gz
    raises ``EOFError`` at a missing end-of-stream marker; any other file is returned as it is.
    """
    name = path.name.lower()
    if name.endswith(".zst"):
        check_zstd_frames(path)
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller through the pair
    if name.endswith(".gz"):
        return io.BufferedReader(gzip.GzipFile(fileobj=raw)), raw
    if name.endswith(".zst"):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        return io.BufferedReader(reader), raw
    return raw, raw
