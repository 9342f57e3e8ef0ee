"""Reading a sweep directory: the spec it ran with (``sweep.yaml``) and each run's ``summary.json``.

What every reader of results starts from (the comparison, its export, README's generated blocks); it
reads and never writes, and it reads only runs no command is writing (:func:`load_summaries`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from experiments.reliability.errors import SuiteError
from experiments.reliability.run_lock import in_use
from experiments.reliability.summaries import SUMMARY_FIELDS, check_summary  # noqa: F401 - importable from here too
from fileio import InputError, NotJSONError, read_json

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

    A run without a readable ``summary.json`` is listed as ``missing`` (none yet) or ``crashed`` (unreadable). A
    run some command is using right now (a sweep's claim or a run lock held: training, testing) is listed as
    ``running`` and its files are not read: only runs nobody writes are, so a comparison beside a running
    sweep never mixes a run's numbers so far with finished ones.
    """
    if names is None:
        names = sweep_record(sweep_dir).get("runs")
    if names is None:
        names = sorted(p.parent.name for p in sweep_dir.glob("*/summary.json"))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SuiteError(f"{sweep_dir / SWEEP_RECORD}: runs={names!r}; valid: a list of run names")
    out = {}
    for name in names:
        path = sweep_dir / name / SUMMARY
        if Path(name).name != name or name.startswith("."):
            raise SuiteError(f"{sweep_dir / SWEEP_RECORD} names the run {name!r}; valid: a directory in {sweep_dir}")
        if (holder := in_use(sweep_dir / name)) is not None:
            out[name] = {"status": "running", "error": f"in use by {holder}"}
            continue
        try:
            found = path.exists()
            out[name] = check_summary(read_json(path, "run summary", dict), path) if found else {"status": "missing"}
        except NotJSONError:  # not JSON at all: cut short by a hard kill
            out[name] = {"status": "crashed", "error": f"unreadable {path}"}
        except InputError as err:  # JSON, but not a summary (an array, nested past reading, huge)
            raise SuiteError(f"{err}; valid: the JSON object a run's fit writes") from None
    return out
