"""Reading a sweep directory: the spec it ran with (``sweep.yaml``) and each run's ``summary.json``.

What every reader of results starts from (the comparison, its export, README's generated blocks); it
reads and never writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from experiments.reliability.errors import SuiteError

SWEEP_RECORD = "sweep.yaml"  # written by the sweep into its directory: its spec, run order and grid
SUMMARY = "summary.json"


def sweep_record(sweep_dir: Path) -> dict:
    """The spec the sweep ran with (``sweep.yaml``: runs in order, metric, baseline, grid ...); {} if absent."""
    path = sweep_dir / SWEEP_RECORD
    if not path.is_file():
        return {}
    try:
        record = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0]
        raise SuiteError(f"{path} is not valid YAML ({first}); valid: the sweep.yaml a sweep writes") from None
    if not isinstance(record, dict):
        raise SuiteError(f"{path} holds {type(record).__name__}, not a mapping; valid: the sweep.yaml a sweep writes")
    return record


def load_summaries(sweep_dir: Path, names: list[str] | None = None) -> dict[str, dict]:
    """``{run name: summary}`` for the given runs (default: the sweep's, in its order; else every run found).

    A run without a readable ``summary.json`` is listed as ``missing`` (none yet) or ``crashed`` (unreadable).
    """
    if names is None:
        names = sweep_record(sweep_dir).get("runs")
    if names is None:
        names = sorted(p.parent.name for p in sweep_dir.glob("*/summary.json"))
    out = {}
    for name in names:
        path = sweep_dir / name / "summary.json"
        try:
            out[name] = json.loads(path.read_text()) if path.exists() else {"status": "missing"}
        except (json.JSONDecodeError, OSError, UnicodeDecodeError):  # half-written by a hard kill
            out[name] = {"status": "crashed", "error": f"unreadable {path}"}
    return out
