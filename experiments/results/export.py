"""``compare SWEEP_DIR --export DIR``: copy a sweep's comparison into the repository, small files only.

README's result tables are generated from these copies (:mod:`experiments.results.readme`), so they can be
rebuilt and checked on a fresh clone that has none of the run directories. What is copied: ``sweep.yaml``
(the spec, run order and grid), each run's ``summary.json`` (curves and final metrics, a few KB), the
comparison's tables and PNGs. Never checkpoints or event files. A file over ``MAX_BYTES`` is skipped
with a note rather than bloating the repository.

An export is never overwritten without ``--overwrite``; with it, the files an earlier export wrote are
replaced and anything else in the directory is left alone.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from experiments.reliability.errors import SuiteError
from experiments.results.runs import SUMMARY, load_summaries

MAX_BYTES = 1 << 20  # 1 MiB: a summary is a few KB, a plot a few hundred
TOP_LEVEL = ("sweep.yaml", "comparison.md", "comparison.csv", "comparison_cells.csv")


def _exported_files(target: Path) -> list[Path]:
    """The files an export wrote into ``target``."""
    found = [target / name for name in TOP_LEVEL] + list(target.glob("*.png")) + list(target.glob(f"*/{SUMMARY}"))
    return [p for p in found if p.is_file()]


def _run_names(sweep_dir: Path) -> list[str]:
    return list(load_summaries(sweep_dir))


def check_target(target: Path, sweep_dir: Path, overwrite: bool) -> None:
    """Raises :class:`SuiteError` (before anything is written) when ``target`` cannot take the export."""
    if target.exists() and not target.is_dir():
        raise SuiteError(f"--export {target} is a file; valid: a directory such as docs/results/<sweep>")
    if target.resolve() == sweep_dir.resolve() or sweep_dir.resolve() in target.resolve().parents:
        raise SuiteError(f"--export {target} lies inside the sweep {sweep_dir}; valid: a directory outside it")
    if _exported_files(target) and not overwrite:
        raise SuiteError(f"--export {target} already holds an exported comparison; valid: --overwrite to replace it")


def export(sweep_dir: Path, target: Path, overwrite: bool = False) -> list[Path]:
    """Copies the comparison of ``sweep_dir`` (written first by ``write_comparison``) into ``target``.

    Returns:
        The files written.
    """
    check_target(target, sweep_dir, overwrite)
    sources = [sweep_dir / name for name in TOP_LEVEL] + sorted(sweep_dir.glob("*.png"))
    sources += [sweep_dir / name / SUMMARY for name in _run_names(sweep_dir)]
    sources = [p for p in sources if p.is_file()]
    for old in _exported_files(target):  # only with --overwrite (checked above): the previous export's files
        old.unlink()
        if old.parent != target and not any(old.parent.iterdir()):
            old.parent.rmdir()
    written = []
    for source in sources:
        size = source.stat().st_size
        if size > MAX_BYTES:
            limit = f"{size / 2**20:.1f} MiB > {MAX_BYTES / 2**20:.0f} MiB"
            print(f"note: {source} not exported ({limit})", file=sys.stderr)
            continue
        dest = target / source.relative_to(sweep_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        written.append(dest)
    return written
