"""Where an export is written: only inside ``--out``, all at once, never over anything unasked.

    --out DIR absent           built in DIR/../.DIR.partial-<pid>/export, renamed to DIR when complete and
                               checked (generated code and the check's caches stay in .../scratch)
    --out DIR exists           refused, unless --overwrite and DIR is empty or an export of the suite
                               (its README.md carries the suite's tag); then swapped in by two renames
    anything fails             the partial directory is removed; DIR is as it was

A reader never sees half an export, and a crash leaves at most a ``.DIR.partial-*`` directory beside DIR.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from experiments.reliability.errors import OutputDirError

SUITE_TAG = "siamesenorm-suite"  # in the model card's tags: marks a folder this command wrote
CARD_FILE = "README.md"


def is_suite_export(directory: Path) -> bool:
    """Whether ``directory`` holds a model card written by ``python -m experiments export``."""
    card = directory / CARD_FILE
    try:
        return card.is_file() and f"- {SUITE_TAG}\n" in card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def check_out(out: Path, overwrite: bool) -> None:
    """Refuses, in one line and before any work, an output that exists (unless replaceable) or cannot be a folder.

    Raises:
        OutputDirError: ``out`` is a file, exists without ``--overwrite``, or is a directory the suite did not
            write (``--overwrite`` replaces only exports).
    """
    if out.is_file() or out.is_symlink():
        raise OutputDirError(f"--out {out} is a file; valid: a directory path that does not exist yet")
    if not out.exists():
        return
    if not overwrite:
        raise OutputDirError(f"--out {out} already exists; valid: --overwrite to replace it, or a new --out")
    if any(out.iterdir()) and not is_suite_export(out):
        raise OutputDirError(
            f"--overwrite: {out} is not an export of this suite (no {CARD_FILE} tagged {SUITE_TAG}); it is left as it "
            "is: remove it yourself or choose another --out"
        )


@contextlib.contextmanager
def staged(out: Path, overwrite: bool) -> Iterator[tuple[Path, Path]]:
    """``(folder, scratch)`` beside ``out``: the export is built in ``folder`` and moved to ``out`` when the block
    succeeds; ``scratch`` (generated code, the reload check's caches) is deleted either way.

    Raises:
        OutputDirError: as :func:`check_out` (checked again: the folder may have appeared meanwhile).
    """
    check_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)  # a leftover of this pid's earlier crash
    folder, scratch = stage / "export", stage / "scratch"
    folder.mkdir(parents=True)
    scratch.mkdir()
    try:
        yield folder, scratch
        check_out(out, overwrite)
        if out.exists():
            trash = out.parent / f".{out.name}.replaced-{os.getpid()}"
            os.replace(out, trash)
            os.replace(folder, out)
            shutil.rmtree(trash)
        else:
            os.replace(folder, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def folder_size(directory: Path) -> tuple[int, int]:
    """(bytes, files) of everything under ``directory``."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def human_size(num_bytes: int) -> str:
    """``4718592 -> '4.5 MiB'``."""
    if num_bytes < 1024:
        return f"{num_bytes} B"
    size, units = num_bytes / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while size >= 1024 and len(units) > 1:
        size, units = size / 1024, units[1:]
    return f"{size:.1f} {units[0]}"
