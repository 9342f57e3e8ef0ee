"""The process launcher: every run of the grid a ``python -m experiments fit`` process on this machine.

A crash or divergence in one run never takes the sweep down. Started again, the sweep skips a run whose
``summary.json`` says it finished (or diverged) and resumes one that was interrupted, killed mid-way
("running") or crashed from its newest readable checkpoint (``--ckpt_path last``, an exact resume; from
scratch when it has none); ``--restart`` reruns those from an emptied directory (only a directory the suite
made: :mod:`experiments.sweeps.ownership`).

Two sweeps on one spec (or a sweep beside a ``fit`` into one of its runs) share the grid instead of racing for
it: each run is claimed before the sweep looks at it, and a run in use elsewhere is skipped with a line naming
the holder (``[2/6] post-lr0.01: in use by sweep stability (pid 123 ...), skipped``), left to that command,
counted apart in the progress line, and not reported as crashed.

Ctrl-C or SIGTERM stops the sweep within a training step: no new run starts, the running ones are stopped
the way a single run is (they save ``interrupted.ckpt``), and the sweep exits 130 / 143 saying how to resume.
The cluster launcher (``launcher: {kind: submitit}``) is :mod:`experiments.sweeps.cluster`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from experiments.monitoring.records import SUMMARY_FILE
from experiments.reliability.run_lock import sweep_claim
from experiments.sweeps.cluster import ACTIVE, job_state, read_jobs
from experiments.sweeps.estimate import run_extra_args
from experiments.sweeps.ownership import prepare_run_dir, read_json, remove_run_dir
from experiments.sweeps.progress import GridProgress, Reporter
from experiments.sweeps.spec import Run, SweepSpec
from fileio import atomic_write_json

_STDOUT = threading.Lock()


def say(line: str) -> None:
    """One whole line on stdout: the runs' threads print concurrently, and ``print`` writes the newline apart."""
    with _STDOUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


DONE = ("finished", "diverged")
IN_USE = "in use"  # run_one's status for a run another sweep (or command) was running: skipped, not crashed
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + signal number, as shells report them


class SweepStopped(Exception):
    """Raised in the main thread when the sweep receives SIGTERM (Ctrl-C raises KeyboardInterrupt)."""


class Children:
    """The run processes alive right now, so a stopped sweep can stop them too and start no others.

    Runs start in their own session: a Ctrl-C in the terminal reaches only the sweep, which forwards
    exactly one signal per stop to each run (a second SIGINT would make a run stop without saving).
    """

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def call(self, argv: list[str], **kwargs) -> int | None:
        """``subprocess.call`` that registers the process; None (nothing started) once the sweep is stopping."""
        with self._lock:
            if self.stopping.is_set():
                return None
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
            self._procs.add(proc)
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)

    def stop(self, signum: int) -> int:
        """Starts no new run and sends ``signum`` to the running ones; returns how many were running."""
        with self._lock:
            self.stopping.set()
            for proc in self._procs:
                proc.send_signal(signum)
            return len(self._procs)


def read_summary(summary: Path) -> dict:
    """A run's ``summary.json`` ({} without one; status "crashed" if unreadable, e.g. half-written)."""
    if not summary.exists():
        return {}
    record = read_json(summary)
    return {"status": "crashed", **record}


def previous_status(summary: Path) -> str | None:
    """The status a run's ``summary.json`` records (None without one; "crashed" if unreadable)."""
    return read_summary(summary).get("status")


def has_checkpoint(run_dir: Path) -> bool:
    return any((run_dir / "checkpoints").glob("*.ckpt"))


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a finished run is tested from: the readable one with the highest recorded step (the later
    written among equal steps: ``last.ckpt`` after the best one), never the file times alone (a copied run
    directory has them in any order)."""
    from experiments.reliability.checkpointing import newest_readable  # brings torch: only when a run is tested

    return newest_readable(run_dir / "checkpoints")


def run_one(
    run: Run,
    spec: SweepSpec,
    sweep_dir: Path,
    tag: str,
    children: Children,
    restart: bool = False,
    progress: GridProgress | None = None,
) -> str:
    """Runs, resumes or skips one run; prints a line when it starts and when it ends; returns its status.

    The run is claimed first (:func:`~experiments.reliability.run_lock.sweep_claim`) and everything else is
    decided under the claim: a run another sweep or command is using, or that a submitit sweep on the spec has
    an active job for (its ``jobs.json``), is skipped ("in use"), never trained twice, and its directory and
    log are left alone.
    """
    name = run.name(spec)
    with sweep_claim(sweep_dir / name, f"sweep {spec.name}") as other:
        record = read_jobs(sweep_dir).get(name) if other is None else None
        if record is not None and (state := job_state(record)) in ACTIVE:  # a submitit sweep's job has it
            other = f"{record.get('cluster', 'submitit')} job {record.get('job_id')} ({state.lower()})"
        if other is not None:
            say(f"{tag}: in use by {other}, skipped (that command finishes it)")
            if progress is not None:
                progress.hold(name)
            return IN_USE
        return _run_claimed(run, spec, sweep_dir, tag, children, restart, progress)


def _run_claimed(
    run: Run,
    spec: SweepSpec,
    sweep_dir: Path,
    tag: str,
    children: Children,
    restart: bool,
    progress: GridProgress | None,
) -> str:
    """:func:`run_one` once this sweep holds the run's claim."""
    name = run.name(spec)
    run_dir = sweep_dir / name
    summary = run_dir / SUMMARY_FILE
    previous = previous_status(summary)
    untested = spec.test and previous == "finished" and "test" not in read_summary(summary)
    if previous in DONE and not untested:
        say(f"{tag}: already done ({previous}), skipped")
        if progress is not None:
            progress.skip(name)
        return "skipped"
    if children.stopping.is_set():
        return "not started"
    argv = run.argv(spec, extra=run_extra_args(spec, run))
    if untested:  # stopped during its test: the fit stands, only the test runs
        say(f"{tag}: finished but not tested, testing")
    elif run_dir.exists():  # interrupted, killed mid-way ("running" or no summary yet), crashed
        attempt = f"previous attempt {previous or 'left no summary'}"
        if restart or not has_checkpoint(run_dir):
            say(f"{tag}: {attempt}, rerunning from scratch")
            remove_run_dir(sweep_dir, name)  # so TensorBoard does not overlay the two attempts
        else:
            say(f"{tag}: {attempt}, resuming from its last checkpoint")
            argv.append("--ckpt_path=last")  # the newest readable checkpoint; curves continue exactly
    prepare_run_dir(sweep_dir, name)
    log = sweep_dir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if spec.parallel > 1:  # share the cores instead of oversubscribing them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // spec.parallel))
    say(f"{tag}: running (log: {log})")
    start = time.perf_counter()
    if progress is not None:
        progress.started(name)
    testing = False
    try:
        with log.open("a" if untested or "--ckpt_path=last" in argv else "w") as fh:
            code = 0 if untested else children.call(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
            testing = code == 0 and spec.test
            if testing:
                ckpt = newest_checkpoint(run_dir)
                if ckpt is not None:
                    test_argv = run.argv(spec, "test", extra=run_extra_args(spec, run)) + [f"--ckpt_path={ckpt}"]
                    code = children.call(test_argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
                else:
                    say(f"{tag}: no checkpoint to test")
    finally:
        if progress is not None:
            progress.finished(name, ran=not untested)
    if code is None:  # the sweep stopped before this process could start
        return "not started"
    return _report(run, tag, summary, log, code, testing, children.stopping.is_set(), spec.metric, start)


def _report(
    run: Run, tag: str, summary: Path, log: Path, code: int, testing: bool, stopping: bool, metric: str, start: float
) -> str:
    """Prints the run's end line and returns its status (recording a crash that left no summary)."""
    record = read_summary(summary)
    status = record.get("status", "crashed")
    if status == "interrupted":
        say(f"{tag}: interrupted at step {record.get('steps', '?')} (run the sweep again to resume)")
    elif code != 0 and stopping:  # stopped during its test, or before fit could save anything
        status = "interrupted"
        what = "test interrupted (run the sweep again to test it)" if testing else "stopped before its first step"
        say(f"{tag}: {what}")
    elif code != 0 and status not in DONE:
        status = "crashed"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        say(f"{tag}: CRASHED (exit {code}): {tail[0][:200]}")
    else:
        value = (record.get("whole_split_val") or record.get("final_val") or {}).get(metric)
        shown = f"{metric} {value:.4g}" if value is not None else ""
        say(f"{tag}: {status} in {time.perf_counter() - start:.0f} s {shown}")
    if status == "crashed" and not summary.exists():
        atomic_write_json(summary, {"scheme": run.scheme, "lr": run.lr, "status": "crashed", "error": str(log)})
    return status


def _raise_stopped(signum: int, frame) -> None:
    raise SweepStopped


def run_locally(spec: SweepSpec, runs: list[Run], sweep_dir: Path, restart: bool) -> dict[str, str]:
    """Runs the grid ``spec.parallel`` at a time with a progress line per run every ``progress_every_s``.

    Returns:
        run name -> status ("finished", "diverged", "crashed", "interrupted", "skipped", "in use" (another sweep or
        command was running it), "not started").

    Raises:
        SystemExit: 130 / 143 after Ctrl-C / SIGTERM, once the running runs have saved.
        SuiteError: the sweep directory's ``jobs.json`` holds an entry that is not a job record (before any run).
    """
    read_jobs(sweep_dir)  # a jobs.json a submitit sweep left that cannot be read: one line before any run starts
    tags = {r.name(spec): f"[{i + 1}/{len(runs)}] {r.name(spec)}" for i, r in enumerate(runs)}
    progress = GridProgress(spec.name, sweep_dir, tags, spec.parallel)
    reporter = Reporter(progress, spec.progress_every_s, say)
    children, stopped_by, statuses = Children(), None, {}
    main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGTERM, _raise_stopped) if main_thread else None
    pool = ThreadPoolExecutor(spec.parallel)
    reporter.start()
    try:
        futures = {
            r.name(spec): pool.submit(run_one, r, spec, sweep_dir, tags[r.name(spec)], children, restart, progress)
            for r in runs
        }
        for name, future in futures.items():
            statuses[name] = future.result()
    except (KeyboardInterrupt, SweepStopped) as stop:
        stopped_by = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else signal.SIGTERM
        running = children.stop(stopped_by)
        say(f"sweep {spec.name}: {stopped_by.name}, {running} running run(s) saving interrupted.ckpt")
        try:
            pool.shutdown(wait=True, cancel_futures=True)
        except (KeyboardInterrupt, SweepStopped):  # asked again: the runs stop now, without saving
            children.stop(signal.SIGINT)
    finally:
        reporter.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        if main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    if stopped_by is not None:
        print(f"sweep {spec.name} stopped: run the same command again to resume it", file=sys.stderr, flush=True)
        raise SystemExit(SIGNAL_EXIT[stopped_by])
    return statuses
