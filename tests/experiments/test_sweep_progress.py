"""The progress a run writes (progress.json) and what the sweep makes of it: a line per run, the grid's ETA."""

from __future__ import annotations

import json
import time
from pathlib import Path

from experiments.monitoring.summary import ProgressFile
from experiments.sweeps.progress import GridProgress, describe_progress, fmt_interval, grid_eta, remaining_seconds


def test_the_progress_file_measures_rate_and_eta(tmp_path: Path):
    path = tmp_path / "progress.json"
    progress = ProgressFile(every_s=0.01)
    progress.start(path, "fit", 0)
    progress.restart_clock(100)  # a fit resumed at step 100 measures its rate from there
    time.sleep(0.2)
    progress.write(120, 400, 2.5)
    record = json.loads(path.read_text())
    assert record["step"] == 120 and record["total"] == 400 and record["loss"] == 2.5
    assert 20 / 0.4 < record["steps_per_s"] < 20 / 0.2 + 1  # 20 steps in ~0.2 s (not 120: the resume)
    assert abs(record["eta_s"] - 280 / record["steps_per_s"]) < 1e-6
    progress.write(400, 400, 2.0, status="finished")
    assert json.loads(path.read_text())["eta_s"] is None


def test_a_phase_of_a_test_is_written_at_once_and_timed_in_its_own_units(tmp_path: Path):
    """A DiT test's sampling and feature passes: the first report of a phase is written at once (the sweep shows
    what the run is doing now), its rate restarts from that phase's count, and its ETA is in that phase's units."""
    path = tmp_path / "progress.json"
    progress = ProgressFile(every_s=3600.0)  # nothing is due in this test: only the phase changes force writes
    progress.start(path, "test", 0)
    progress.phase_progress("sampling", 0, 500)
    first = json.loads(path.read_text())
    assert (first["stage"], first["phase"], first["step"], first["total"]) == ("test", "sampling", 0, 500)
    time.sleep(0.2)
    progress.phase_progress("sampling", 250, 500)  # not due, not done: kept for the next interval
    assert json.loads(path.read_text())["step"] == 0
    progress.phase_progress("sampling", 500, 500)  # a phase's last report is written
    done = json.loads(path.read_text())
    assert done["step"] == 500 and 500 / 0.4 < done["steps_per_s"] < 500 / 0.2 + 1 and done["eta_s"] == 0
    progress.phase_progress("sample features", 100, 500)  # a new phase: at once, its rate not sampling's
    record = json.loads(path.read_text())
    assert (record["phase"], record["step"], record["total"], record["steps_per_s"]) == (
        "sample features",
        100,
        500,
        None,
    )
    progress.start(path, "fit", 0)
    progress.write(1, 10, 2.0)
    assert json.loads(path.read_text())["phase"] is None  # a new stage starts without a phase


def test_a_progress_line_and_the_grids_eta():
    now = time.time()
    line = describe_progress(
        {"step": 120, "total": 200, "loss": 1.7344, "steps_per_s": 3.1, "eta_s": 26, "updated": now}
    )
    assert line == "step 120/200 (60%), loss 1.734, 3.1 steps/s, eta 00:26"
    assert describe_progress({"stage": "test", "step": 3, "total": 8}) == "testing, batch 3/8"
    sampling = {"stage": "test", "phase": "sampling", "step": 250, "total": 500, "steps_per_s": 3.9, "eta_s": 64}
    assert describe_progress(sampling) == "testing: sampling 250/500 (50%), 3.9/s, eta 01:04"
    assert describe_progress({**sampling, "steps_per_s": None, "eta_s": None}) == "testing: sampling 250/500 (50%)"
    assert remaining_seconds(sampling) is None  # a test's phases never enter the grid's ETA (it counts fit steps)
    assert describe_progress({}) == "starting"
    assert fmt_interval(3 * 86400 + 3723) == "3d 1:02:03" and fmt_interval(None) == "?"
    assert abs(remaining_seconds({"eta_s": 30, "updated": now - 10}) - 20) < 1  # 10 s of it passed already
    # Two runs with 10 s and 30 s left, 4 waiting runs of a typical 60 s, two at a time: (40 + 240) / 2 = 140 s.
    assert grid_eta([10.0, 30.0], [60.0, 50.0, 70.0], waiting=4, parallel=2) == 140.0
    assert grid_eta([None, 30.0], [60.0], waiting=0, parallel=2) is None  # a run without an estimate yet
    assert grid_eta([], [], waiting=0, parallel=1) == 0.0


def test_runs_done_before_the_sweep_started_are_not_waiting(tmp_path: Path):
    """A sweep run again over 15 runs of which 9 finished before: 4 left to run, not 13 (nor their ETA)."""
    tags = {f"r{i}": f"[{i + 1}/15] r{i}" for i in range(15)}
    grid = GridProgress("g", tmp_path, tags, parallel=2)
    for i in range(9):
        grid.skip(f"r{i}")
    grid.started("r9"), grid.finished("r9", ran=True)
    grid.started("r10")
    (tmp_path / "r10").mkdir()
    (tmp_path / "r10" / "progress.json").write_text(
        json.dumps({"step": 1, "total": 4, "eta_s": 30.0, "updated": time.time()})
    )
    line = grid.report()[-1]
    assert line.startswith("sweep g: 1 done (+9 done before), 1 running, 4 waiting; eta "), line
