"""The records a sweep writes beside its runs, read back: ``tuning.yaml`` (a tune-then-compare protocol's picks)
and ``stages.yaml`` (a staged sweep's looks).

The sweep writes them (:mod:`experiments.sweeps.protocol`, :mod:`experiments.sweeps.stages`) and reads them back
when it resumes; ``compare`` reads them to state the verdicts the way the sweep reached them (each staged cell
at its look's level) and README's paper table reads a protocol's picks. One reader for all of them, here, below
both.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from experiments.reliability.errors import SuiteError

TUNING_RECORD = "tuning.yaml"
TUNING_TABLE = "tuning.md"
STAGES_RECORD = "stages.yaml"
STAGES_TABLE = "stages.md"


class RecordError(SuiteError):
    """A record beside a sweep's runs that is not one a sweep writes, or that was written under other settings."""


def read_record(
    path: Path, what: str, entry: tuple[str, type], planned: dict, did: str, valid: str, source: str
) -> dict | None:
    """A record a sweep wrote beside its runs (``what``: "tuning", "stages"); None when there is none yet.

    Args:
        path: the record's file.
        what: its name in the error line.
        entry: the key it must hold and that key's type (``("looks", list)``).
        planned: settings the record must have been written under (``{"stages": [3, 5, 8], ...}``).
        did: what the record did, for the error line ("recorded its looks").
        valid: what to do instead, for the error line.
        source: where ``planned`` came from (the sweep file, or ``sweep.yaml``).

    Raises:
        RecordError: one line when the file is not such a record, or was written under other ``planned``
            settings than ``source`` has now.
    """
    if not path.is_file():
        return None
    try:
        record = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        record = None
    key, kind = entry
    if not isinstance(record, dict) or not isinstance(record.get(key), kind):
        raise RecordError(f"{path} is not the {what} record a sweep writes; valid: move it away and run again")
    differs = [k for k in planned if record.get(k) != planned[k]]
    if differs:
        now = ", ".join(f"{k}={planned[k]!r}" for k in differs)
        raise RecordError(f"{path} {did} under another {', '.join(differs)} ({source}: {now}); valid: {valid}")
    return record
