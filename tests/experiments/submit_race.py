"""The race of two submitit sweeps on one spec made certain instead of likely: each sweep writes
``ARRIVED_DIR/<pid>`` when it starts deciding what to submit (``Submission.submit``) and submits nothing until the
other has arrived there too. Without claims both have read ``jobs.json`` before either writes it, every time; with
claims the second finds the runs held (or recorded) and submits nothing, so the first one's wait ends when the
second arrives. Test-only: the sweep is otherwise unchanged.

    python -m tests.experiments.submit_race ARRIVED_DIR sweep SPEC     # one sweep, as its own process
    monkeypatch.setattr(Submission, name, f) for name, f in racing(ARRIVED_DIR).items()   # the other, in a test
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from experiments.sweeps import cluster, sweep

SWEEPS = 2  # sweeps in the race
TIMEOUT_S = 300.0


def racing(arrived: Path) -> dict:
    """``Submission.submit`` and ``Submission._submit`` replacements that hold the submission until every sweep
    of the race has started deciding."""
    submit, enqueue = cluster.Submission.submit, cluster.Submission._submit

    def submit_arriving(self, runs, restart):
        arrived.mkdir(parents=True, exist_ok=True)
        (arrived / str(os.getpid())).touch()
        return submit(self, runs, restart)

    def enqueue_when_all_arrived(self, runs):
        deadline = time.monotonic() + TIMEOUT_S
        while len(list(arrived.iterdir())) < SWEEPS and time.monotonic() < deadline:
            time.sleep(0.05)
        return enqueue(self, runs)

    return {"submit": submit_arriving, "_submit": enqueue_when_all_arrived}


def main() -> int | None:
    for name, function in racing(Path(sys.argv[1])).items():
        setattr(cluster.Submission, name, function)
    return sweep.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
