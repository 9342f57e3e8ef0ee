"""Where every run of a sweep stands, from its directory and its job: ``sweep SPEC --status`` and ``--wait``.

state        from
finished     summary.json status finished (and tested, when the spec tests)
diverged     summary.json status diverged
testing      finished, its test not recorded yet, its job active
running      its job running (or, for local processes, progress.json fresh)
queued       its job pending or requeued
interrupted  stopped by a signal, no active job: the next ``sweep SPEC`` resumes it
failed       crashed, or its job ended without a result (the scheduler's state says why)
not started  nothing yet
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from experiments.monitoring.records import SUMMARY_FILE
from experiments.sweeps.cluster import ACTIVE, QUEUED, RUNNING, Submission, job_state, read_jobs
from experiments.sweeps.ownership import read_json
from experiments.sweeps.progress import describe_progress, fmt_interval, grid_eta, read_progress, remaining_seconds
from experiments.sweeps.spec import Run, SweepSpec

STALE_S = 300.0  # a progress file older than this (with no job to ask) belongs to a run that is gone


@dataclass
class RunState:
    """One run as ``--status`` shows it."""

    name: str
    state: str
    job: str
    detail: str
    remaining_s: float | None
    duration_s: float | None


def run_state(spec: SweepSpec, run: Run, sweep_dir: Path, jobs: dict[str, dict]) -> RunState:
    name = run.name(spec)
    run_dir = sweep_dir / name
    summary, progress = read_json(run_dir / SUMMARY_FILE), read_progress(run_dir)
    status = summary.get("status") or (None if not (run_dir / SUMMARY_FILE).exists() else "crashed")
    record = jobs.get(name)
    scheduler = job_state(record) if record else None
    job = str(record["job_id"]) if record else "-"
    fresh = bool(progress) and time.time() - progress.get("updated", 0) < max(STALE_S, 4 * spec.progress_every_s)
    duration = summary.get("wall_time_s") if status in ("finished", "diverged") else None
    if status in ("finished", "diverged"):
        untested = spec.test and status == "finished" and "test" not in summary
        state = "testing" if untested and (scheduler in ACTIVE or (scheduler is None and fresh)) else status
        if untested and state != "testing":
            state = "interrupted"  # fit done, test missing: the next sweep runs the test only
        value = (summary.get("whole_split_val") or summary.get("final_val") or {}).get(spec.metric)
        detail = f"step {summary.get('steps', '?'):,}" + (f", {spec.metric} {value:.4g}" if value is not None else "")
        if state == "testing":
            detail = describe_progress(progress)
        return RunState(name, state, job, detail, None, duration)
    if scheduler in RUNNING or (scheduler in (None, "UNKNOWN") and fresh and status == "running"):
        return RunState(name, "running", job, describe_progress(progress), remaining_seconds(progress), None)
    if scheduler in QUEUED:
        where = f"resumes from step {summary.get('steps', 0):,}" if summary.get("steps") else "waiting"
        return RunState(name, "queued", job, f"{scheduler.lower()}, {where}", None, None)
    if status == "interrupted":
        return RunState(name, "interrupted", job, f"stopped at step {summary.get('steps', '?')}", None, None)
    if status in ("crashed", "running") or (record and scheduler not in (None, "UNKNOWN")):
        why = summary.get("error") or (f"job {scheduler.lower()}" if scheduler else "process gone")
        return RunState(name, "failed", job, str(why).splitlines()[0][:120], None, None)
    return RunState(name, "not started", job, "", None, None)


def run_states(spec: SweepSpec, runs: list[Run], sweep_dir: Path) -> list[RunState]:
    jobs = read_jobs(sweep_dir)
    return [run_state(spec, run, sweep_dir, jobs) for run in runs]


def status_table(spec: SweepSpec, sweep_dir: Path, states: list[RunState]) -> str:
    """The ``--status`` report: a line per run, then the counts per state and the grid's ETA."""
    width = max(len(s.name) for s in states)
    jobw = max(3, *(len(s.job) for s in states))
    lines = [
        f"sweep {spec.name} ({sweep_dir}): {len(states)} runs, launcher {_launcher(spec)}",
        f"  {'run':<{width}}  {'state':<11}  {'job':<{jobw}}  progress",
    ]
    lines += [f"  {s.name:<{width}}  {s.state:<11}  {s.job:<{jobw}}  {s.detail}" for s in states]
    counts: dict[str, int] = {}
    for s in states:
        counts[s.state] = counts.get(s.state, 0) + 1
    lines.append(
        "  " + ", ".join(f"{n} {state}" for state, n in counts.items()) + f"; eta {fmt_interval(eta(spec, states))}"
    )
    return "\n".join(lines)


def eta(spec: SweepSpec, states: list[RunState]) -> float | None:
    """The grid's ETA from the runs' own estimates (None while any is unknown)."""
    running = [s.remaining_s for s in states if s.state == "running"]
    waiting = sum(s.state in ("queued", "not started", "interrupted") for s in states)
    durations = [s.duration_s for s in states if s.duration_s]
    parallel = spec.launcher["array_parallelism"] if spec.submitit else spec.parallel
    if not running and not waiting:
        return 0.0
    return grid_eta(running, durations, waiting, max(1, min(parallel, len(running) + waiting)))


def _launcher(spec: SweepSpec) -> str:
    la = spec.launcher
    if not spec.submitit:
        return f"process, {spec.parallel} at a time"
    return f"submitit {la['cluster']}, {la['nodes']} node(s) x {la['gpus_per_node']} GPU(s) per job"


def watch(spec: SweepSpec, runs: list[Run], sweep_dir: Path, submission: Submission | None, emit=print) -> None:
    """Prints a progress line per running run and the grid's ETA every ``progress_every_s`` until no run is
    queued or running (starting waiting local jobs as slots free), nor held by another sweep on the spec."""
    tags = {r.name(spec): f"[{i + 1}/{len(runs)}] {r.name(spec)}" for i, r in enumerate(runs)}
    while True:
        if submission is not None:
            submission.top_up()
        states = run_states(spec, runs, sweep_dir)
        busy = [s for s in states if s.state in ("running", "queued", "testing")]
        if not busy and not (submission is not None and (submission.pending or submission.others_busy())):
            return
        for s in busy:
            emit(f"{tags[s.name]}: {s.detail}" if s.state == "running" else f"{tags[s.name]}: {s.state}, {s.detail}")
        done = sum(s.state in ("finished", "diverged", "failed") for s in states)
        emit(
            f"sweep {spec.name}: {done} done, {len(busy)} running or queued, "
            f"{len(states) - done - len(busy)} waiting; eta {fmt_interval(eta(spec, states))} (grid)"
        )
        time.sleep(spec.progress_every_s)
