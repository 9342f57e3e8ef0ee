"""Reading a sweep directory: the spec it ran with (``sweep.yaml``) and each run's ``summary.json``.

What every reader of results starts from (the comparison, its export, README's generated blocks); it
reads and never writes, and it reads only runs no command is writing (:func:`load_summaries`).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from experiments.reliability.errors import SuiteError
from experiments.reliability.run_lock import in_use
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


_NUMBER = (int, float)
# What the comparison reads from a summary, and the JSON types it may hold (None is always allowed).
SUMMARY_FIELDS: dict[str, tuple[type, ...]] = {
    "task": (str,), "scheme": (str,), "status": (str,), "error": (str,), "lr": _NUMBER, "params": (int,),
    "steps": (int,), "wall_time_s": _NUMBER, "final_train_loss": _NUMBER, "final_val": (dict,),
    "baseline_loss": _NUMBER, "diverged_at": (int,), "spikes": (int,), "train_curve": (list,),
    "val_curve": (list,), "test": (dict,), "test_protocol": (dict,),
}  # fmt: skip


def check_summary(summary: dict, path: Path) -> dict:
    """``summary`` if every field the comparison reads has its type; a one-line :class:`SuiteError` otherwise."""
    for key, types in SUMMARY_FIELDS.items():
        value = summary.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            valid = " or ".join(t.__name__ for t in types)
            what = type(value).__name__
            raise SuiteError(f"run summary {path}: {key}={repr(value)[:60]} is a {what}; valid: {valid}")
    for key in ("final_val", "test"):
        for name, value in (summary.get(key) or {}).items():
            if value is not None and (not isinstance(value, _NUMBER) or isinstance(value, bool)):
                raise SuiteError(f"run summary {path}: {key}[{name!r}]={repr(value)[:60]}; valid: a number")
    for key in ("train_curve", "val_curve"):
        for point in summary.get(key) or []:
            if not isinstance(point, list) or len(point) != 2 or not isinstance(point[0], int):
                raise SuiteError(f"run summary {path}: {key} holds {repr(point)[:60]}; valid: [step, value] pairs")
    return summary


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
