"""``compare SWEEP_DIR --export DIR``: copy a sweep's comparison into the repository, small files only.

README's result tables are generated from these copies (:mod:`experiments.results.readme`), so they can be
rebuilt and checked on a fresh clone that has none of the run directories. What is copied: ``sweep.yaml``
(the spec, run order and grid), each run's ``summary.json`` (curves and final metrics, a few KB), the
comparison's tables (the speed table ``speed.md`` / ``speed.csv`` too, where runs recorded their speed) and
PNGs. Never checkpoints or event files. A file over ``MAX_BYTES`` is skipped with a note rather than bloating the
repository.

An export is never overwritten without ``--overwrite``. Each export records the files it wrote in
``.suite-export.json`` inside the directory, which marks it as an export's own; ``--overwrite`` replaces only
such a directory (or one made before exports recorded their files, holding nothing but what an export writes),
never a run directory or any other folder, and never a file the manifest does not record. The files the new
export writes are replaced,
the files the previous export recorded and this one no longer writes (a run the sweep dropped) are removed,
and nothing else in the directory is touched: a file the suite did not record as its own is never deleted.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from experiments.reliability.errors import SuiteError
from experiments.reliability.layout import RUN_MARKER
from experiments.results.runs import SUMMARY, load_summaries
from experiments.results.speed import SPEED_CSV, SPEED_TABLE
from fileio import InputError, atomic_write_json, output_dir, read_json

MAX_BYTES = 1 << 20  # 1 MiB: a summary is a few KB, a plot a few hundred
# the sweep's own records go along: a staged sweep's looks, a protocol's picks and compute multipliers, the
# measurement's spread, the speed table
TOP_LEVEL = ("sweep.yaml", "comparison.md", "comparison.csv", "comparison_cells.csv", "stages.yaml", "stages.md",
             "tuning.yaml", "tuning.md", "compute.yaml", "compute.md", "measurement.md",
             SPEED_TABLE, SPEED_CSV)  # fmt: skip


MANIFEST = ".suite-export.json"  # {"made_by": "compare --export", "sweep": ..., "files": [relative paths]}


def recorded_files(target: Path) -> list[Path]:
    """The files the previous export recorded in ``target``'s manifest (that still exist); [] without one.

    A manifest entry that is not a plain relative path inside ``target`` is refused: the manifest is a file a
    user could have edited, and it decides what ``--overwrite`` deletes.
    """
    manifest = target / MANIFEST
    if not manifest.is_file():
        return []
    try:
        files = read_json(manifest, "export manifest", dict).get("files")
    except InputError as err:
        raise SuiteError(f"{err}; valid: the manifest an export writes, or remove it") from None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise SuiteError(f"export manifest {manifest} has no list of file names; valid: the manifest an export writes")
    out = []
    for name in files:
        path = target / name
        if Path(name).is_absolute() or ".." in Path(name).parts or name.startswith(".") or path.is_symlink():
            raise SuiteError(f"export manifest {manifest} names {name!r}; valid: files inside {target}")
        if path.is_file():
            out.append(path)
    return out


def _sources(sweep_dir: Path) -> list[Path]:
    """The files of the comparison to copy, in a fixed order."""
    sources = [sweep_dir / name for name in TOP_LEVEL] + sorted(sweep_dir.glob("*.png"))
    summaries = load_summaries(sweep_dir)  # a run still running (or not started) has no result to copy yet
    sources += [sweep_dir / n / SUMMARY for n, s in summaries.items() if s.get("status") not in ("running", "missing")]
    return [p for p in sources if p.is_file()]


def _export_shaped(relative: Path) -> bool:
    """Whether a path inside a directory is one an export writes: a top-level table, sweep.yaml or PNG, or a
    run's ``summary.json`` one level down."""
    parts = relative.parts
    if len(parts) == 1:
        return parts[0] in TOP_LEVEL or parts[0].endswith(".png")
    return len(parts) == 2 and parts[1] == SUMMARY and not parts[0].startswith(".")


def _not_an_export(target: Path) -> str | None:
    """What in ``target`` shows it is no earlier export's directory (only those may be overwritten), or None.

    A run directory (the suite's :data:`RUN_MARKER` in it or one level down) never is, manifest or not; a
    directory without an export's manifest is one only if it holds nothing but what an export writes (an
    export made before exports recorded their files)."""
    for folder in [target, *sorted(p for p in target.iterdir() if p.is_dir() and not p.is_symlink())]:
        if (folder / RUN_MARKER).exists():
            return f"{folder} is a run directory (it holds {RUN_MARKER})"
    if (target / MANIFEST).is_file():
        return None
    for folder, dirs, files in os.walk(target):
        dirs.sort()
        for name in sorted(files):
            relative = (Path(folder) / name).relative_to(target)
            if not _export_shaped(relative):
                return f"it holds {relative}, which no export writes, and no {MANIFEST} marks it as an export"
    return None


def check_target(target: Path, sweep_dir: Path, overwrite: bool) -> None:
    """Raises :class:`SuiteError` (before anything is written) when ``target`` cannot take the export.

    ``--overwrite`` replaces only what an earlier export wrote: the files its manifest records (a file it would
    write that the manifest does not record is refused), in a directory that is no run directory.
    """
    try:
        output_dir(target, "--export")
    except InputError as err:
        raise SuiteError(str(err)) from None
    if target.resolve() == sweep_dir.resolve() or sweep_dir.resolve() in target.resolve().parents:
        raise SuiteError(f"--export {target} lies inside the sweep {sweep_dir}; valid: a directory outside it")
    names = dict.fromkeys([*TOP_LEVEL, "curves.png", *(str(p.relative_to(sweep_dir)) for p in _sources(sweep_dir))])
    if overwrite and target.is_dir():
        recorded = set(recorded_files(target))  # a manifest that names files outside the export is refused now
        problem = _not_an_export(target)
        if problem is None and (target / MANIFEST).is_file():
            unrecorded = [target / n for n in names if (target / n).exists() and target / n not in recorded]
            if unrecorded:
                problem = f"it holds {unrecorded[0].relative_to(target)}, which its {MANIFEST} does not record"
        if problem is not None:
            raise SuiteError(
                f"--export {target} --overwrite: {problem}; --overwrite replaces only the files an earlier export "
                "wrote; valid: the directory of an earlier export, or a new directory"
            )
        return
    if overwrite:
        return
    if (target / MANIFEST).is_file():
        raise SuiteError(f"--export {target} already holds an exported comparison; valid: --overwrite to replace it")
    clashes = [target / name for name in names if (target / name).exists()]
    if clashes:
        raise SuiteError(
            f"--export {target} already holds {clashes[0].relative_to(target)}"
            f"{f' and {len(clashes) - 1} more' if len(clashes) > 1 else ''} (an exported comparison?); "
            "valid: --overwrite to replace them, or another directory"
        )


def export(sweep_dir: Path, target: Path, overwrite: bool = False) -> list[Path]:
    """Copies the comparison of ``sweep_dir`` (written first by ``write_comparison``) into ``target``.

    Returns:
        The files written.
    """
    check_target(target, sweep_dir, overwrite)
    previous = recorded_files(target)
    written = []
    for source in _sources(sweep_dir):
        size = source.stat().st_size
        if size > MAX_BYTES:
            limit = f"{size / 2**20:.1f} MiB > {MAX_BYTES / 2**20:.0f} MiB"
            print(f"note: {source} not exported ({limit})", file=sys.stderr)
            continue
        dest = target / source.relative_to(sweep_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink():
            dest.unlink()  # replace the link itself, never write through it to where it points
        shutil.copyfile(source, dest)
        written.append(dest)
    for old in set(previous) - set(written):  # recorded by the previous export, not written by this one
        old.unlink()
        if old.parent != target and not any(old.parent.iterdir()):
            old.parent.rmdir()
    files = sorted(str(p.relative_to(target)) for p in written)
    atomic_write_json(target / MANIFEST, {"made_by": "compare --export", "sweep": str(sweep_dir), "files": files})
    return written
