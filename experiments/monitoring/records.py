"""The small files a run keeps about itself, and how they are written: atomically, readable while they change.

Kept free of Lightning so the processes that only read or mark run directories (a sweep, a cluster job's
wrapper) start in a fraction of a second instead of importing the training stack.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fileio import atomic_write_json

SUMMARY_FILE = "summary.json"
PROGRESS_FILE = "progress.json"
RUN_MARKER = ".suite-run.json"


def read_json(path: Path) -> dict:
    """A small JSON file written by the suite; {} when absent or half-written."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past what json reads
        return {}
    return value if isinstance(value, dict) else {}


def mark_run_dir(run_dir: Path, **fields: object) -> None:
    """Writes the marker that makes ``run_dir`` a suite run (kept if present: it records who created it)."""
    marker = run_dir / RUN_MARKER
    if not marker.exists():
        atomic_write_json(marker, {"created_by": "experiments", "created": time.time(), **fields})
