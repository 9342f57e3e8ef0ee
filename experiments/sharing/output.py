"""Where an export is written: only inside ``--out``, all at once, never over anything unasked.

    --out DIR absent           built in DIR/../.DIR.partial-<pid>/export, renamed to DIR when complete and
                               checked (generated code and the check's caches stay in .../scratch); every
                               file gets the mode the user's umask gives (0644 under 022), weights included
    --out DIR exists           refused, unless --overwrite and DIR is empty or an export of the suite
                               (its README.md carries the suite's tag) holding only the files its card
                               lists; then swapped in by two renames
    never                      a file, a symlink, a path under a file, the run directory or a folder above it
    anything fails             the partial directory is removed; DIR is as it was

A reader never sees half an export, and a crash leaves at most a ``.DIR.partial-*`` directory beside DIR.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from experiments.reliability.errors import OutputDirError
from fileio.checks import InputError, output_dir

SUITE_TAG = "siamesenorm-suite"  # in the model card's tags: marks a folder this command wrote
CARD_FILE = "README.md"


def is_suite_export(directory: Path) -> bool:
    """Whether ``directory`` holds a model card written by ``python -m experiments export``."""
    card = directory / CARD_FILE
    try:
        return card.is_file() and f"- {SUITE_TAG}\n" in card.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def export_files(directory: Path) -> set[str] | None:
    """The files an earlier export wrote into ``directory``, as its card lists them (the card included);
    None when ``directory`` is not a suite export."""
    if not is_suite_export(directory):
        return None
    listed = re.findall(r"^\| `([^`]+)` \| [^|]+ \|$", (directory / CARD_FILE).read_text(encoding="utf-8"), re.M)
    return {*listed, CARD_FILE}


def check_out(out: Path, overwrite: bool, run_dir: Path | None = None, ckpt: Path | None = None) -> None:
    """Refuses, in one line and before any work, an output that exists (unless replaceable) or cannot be a folder.

    Replaceable (``--overwrite``): an empty directory, or an earlier export holding only the files its card
    lists, so replacing it removes nothing else. Never: a file, a symlink, a path under a file, the run
    directory or a folder holding it (or the checkpoint), a folder the suite did not write.

    Raises:
        OutputDirError: one line naming ``--out``, what is in the way, and what is valid.
    """
    if out.is_symlink():
        raise OutputDirError(
            f"--out {out} is a symlink (to {os.readlink(out)}); valid: a directory path that is not a link"
        )
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {out} is a file; valid: a directory path that does not exist yet")
    try:
        output_dir(out, "--out")
    except InputError as err:
        raise OutputDirError(str(err)) from None
    resolved = out.resolve()
    for inside, what in ((run_dir, "the run directory"), (ckpt, "the checkpoint")):
        if inside is not None and (resolved == inside.resolve() or resolved in inside.resolve().parents):
            raise OutputDirError(
                f"--out {out} is or holds {what} {inside}; valid: a directory outside the run (e.g. exports/NAME)"
            )
    if not out.exists():
        return
    if not overwrite:
        raise OutputDirError(f"--out {out} already exists; valid: --overwrite to replace it, or a new --out")
    present = {p.relative_to(out).as_posix() for p in out.rglob("*") if not p.is_dir()}
    if not present:
        return
    own = export_files(out)
    if own is None:
        raise OutputDirError(
            f"--overwrite: {out} is not an export of this suite (no {CARD_FILE} tagged {SUITE_TAG}); it is left as it "
            "is: remove it yourself or choose another --out"
        )
    foreign = sorted(present - own)
    if foreign:
        raise OutputDirError(
            f"--overwrite: {out}/{foreign[0]} is not a file of the earlier export (its {CARD_FILE} does not list it"
            f"{f'; {len(foreign) - 1} more' if len(foreign) > 1 else ''}); it is left as it is: move it out or "
            "choose another --out"
        )


@contextlib.contextmanager
def staged(
    out: Path, overwrite: bool, run_dir: Path | None = None, ckpt: Path | None = None
) -> Iterator[tuple[Path, Path]]:
    """``(folder, scratch)`` beside ``out``: the export is built in ``folder`` and moved to ``out`` when the block
    succeeds; ``scratch`` (generated code, the reload check's caches) is deleted either way.

    Raises:
        OutputDirError: as :func:`check_out` (checked again: the folder may have appeared meanwhile).
    """
    check_out(out, overwrite, run_dir, ckpt)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)  # a leftover of this pid's earlier crash
    folder, scratch = stage / "export", stage / "scratch"
    folder.mkdir(parents=True)
    scratch.mkdir()
    try:
        yield folder, scratch
        share_as_umask_says(folder)
        check_out(out, overwrite, run_dir, ckpt)
        if out.exists():
            trash = out.parent / f".{out.name}.replaced-{os.getpid()}"
            os.replace(out, trash)
            os.replace(folder, out)
            shutil.rmtree(trash)
        else:
            os.replace(folder, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def share_as_umask_says(folder: Path) -> None:
    """Gives every file and directory under ``folder`` the mode a plain ``open`` / ``mkdir`` would under the
    process's umask (0644 / 0755 for umask 022, group-writable for 002): some writers (safetensors) create
    their files 0600, which would keep a shared export from the group."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


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
