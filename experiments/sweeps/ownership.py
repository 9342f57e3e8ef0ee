"""Which directories a sweep may write into and delete: only the ones the suite made, only under its own root.

    <runs_root>/<task>/<name>/          the sweep directory: .suite-sweep.json marks it as a sweep's
        <run>/                          a run directory: .suite-run.json (written by the sweep and by the run)
        logs/  submitit/  sweep.yaml    the sweep's own files

``--restart`` (a run from scratch) and every other cleanup remove a run directory only when it lies directly
in the sweep directory, is a real directory (not a symlink) and carries the run marker. A directory in the
way that the suite did not make is an error naming it, never deleted. Directories made before the markers
existed are recognised by the files only a suite run writes (``summary.json`` beside ``config.yaml``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from experiments.monitoring.records import RUN_MARKER, SUMMARY_FILE, mark_run_dir, read_json
from experiments.reliability.errors import SuiteError
from fileio import atomic_write_json

SWEEP_MARKER = ".suite-sweep.json"


def is_suite_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` was made by the suite (its marker, or a pre-marker run's summary and config)."""
    if not run_dir.is_dir() or run_dir.is_symlink():
        return False
    if (run_dir / RUN_MARKER).is_file():
        return True
    return (run_dir / SUMMARY_FILE).is_file() and (run_dir / "config.yaml").is_file()


def is_marker_or_its_temp(name: str) -> bool:
    """The sweep marker, or the temp file another sweep writes it through (``fileio.atomic.temp_path``)."""
    return name == SWEEP_MARKER or (name.startswith(f".{SWEEP_MARKER}.") and name.endswith(".tmp"))


def claim_sweep_dir(sweep_dir: Path, name: str, source: str) -> None:
    """Creates (or adopts) the sweep directory; refuses a non-empty directory the suite did not make.

    Raises:
        SuiteError: the path is a file, a symlink, or a foreign non-empty directory.
    """
    if sweep_dir.is_symlink() or (sweep_dir.exists() and not sweep_dir.is_dir()):
        raise SuiteError(f"sweep directory {sweep_dir} is a file or a link ({source}); valid: a directory path")
    marker = sweep_dir / SWEEP_MARKER
    if sweep_dir.is_dir() and not marker.exists():
        made_by_suite = (sweep_dir / "sweep.yaml").is_file() or any(
            is_suite_run(p) or is_marker_or_its_temp(p.name) for p in sweep_dir.iterdir()
        )  # another sweep on this spec may be writing the marker (its temp file) right now
        if any(sweep_dir.iterdir()) and not made_by_suite:
            raise SuiteError(
                f"{sweep_dir} exists and was not made by a sweep ({source}); valid: another sweep name or runs_root"
            )
    for parent in sweep_dir.parents:  # a file in the way says so in one line instead of a traceback
        if parent.exists():
            if not parent.is_dir():
                raise SuiteError(f"cannot create {sweep_dir}: {parent} is a file ({source})")
            break
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if not marker.exists():
        atomic_write_json(marker, {"created_by": "experiments sweep", "sweep": name, "created": time.time()})


def prepare_run_dir(sweep_dir: Path, run_name: str) -> Path:
    """The run's directory, created and marked; an existing one must be a suite run (else one-line error)."""
    run_dir = sweep_dir / run_name
    if run_dir.exists() and not is_suite_run(run_dir):
        raise SuiteError(f"{run_dir} exists and is not a suite run directory; move it away to run {run_name}")
    run_dir.mkdir(parents=True, exist_ok=True)
    mark_run_dir(run_dir, sweep=sweep_dir.name, run=run_name)
    return run_dir


def remove_run_dir(sweep_dir: Path, run_name: str) -> None:
    """Deletes a run directory for a fresh start, only if the suite made it and it lies in ``sweep_dir``.

    Raises:
        SuiteError: the directory is not a suite run, or it resolves outside the sweep directory.
    """
    run_dir = sweep_dir / run_name
    if not run_dir.exists() and not run_dir.is_symlink():
        return
    inside = run_dir.resolve().parent == sweep_dir.resolve()
    if not inside or not is_suite_run(run_dir):
        raise SuiteError(f"refusing to delete {run_dir}: not a suite run directory inside {sweep_dir}")
    shutil.rmtree(run_dir)


__all__ = ["SWEEP_MARKER", "claim_sweep_dir", "is_suite_run", "prepare_run_dir", "read_json", "remove_run_dir"]
