"""``python -m tests.experiments.submit_race ARRIVED_DIR SWEEP_ARGS...``: the real ``sweep`` command, with the
race of two submitit sweeps on one spec made certain instead of likely.

Each process writes ``ARRIVED_DIR/<pid>`` when it starts deciding what to submit (``Submission.submit``), and
submits nothing until the other process has arrived there too: without claims both have read ``jobs.json``
before either writes it, every time. With claims the second one finds the runs held (or recorded) and submits
nothing, so the first one's wait ends when the second arrives. Test-only: the sweep is otherwise unchanged.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from experiments.sweeps import cluster, sweep

SWEEPS = 2  # processes in the race
TIMEOUT_S = 300.0


def main() -> int | None:
    arrived = Path(sys.argv[1])
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

    cluster.Submission.submit = submit_arriving
    cluster.Submission._submit = enqueue_when_all_arrived
    return sweep.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
