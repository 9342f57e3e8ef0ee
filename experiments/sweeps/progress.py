"""Live progress of a sweep: a line per running run every ``progress_every_s``, and the grid's ETA.

Each run's :class:`~experiments.monitoring.summary.RunSummary` rewrites ``<run>/progress.json`` every few
seconds (step / total, latest train loss, steps/s, ETA); the sweep reads those files, so the same lines come
from local processes and from cluster jobs on a shared file system. The lines are plain text meant to read
well in a log file as on a terminal::

    [2/6] post-lr0.01: step 120/200 (60%), loss 1.734, 3.1 steps/s, eta 00:26
    [3/6] siamese-lr0.01: testing, batch 4/8
    sweep stability: 1 done, 2 running, 3 waiting; eta 03:10 (grid)

A sweep started again counts the runs it skipped apart (``1 done (+4 done before), ...``), and so are the runs
another sweep or command is running (``1 running, 2 in use elsewhere, ...``): they are neither waiting nor part
of the grid's ETA.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from experiments.monitoring.records import PROGRESS_FILE
from experiments.sweeps.ownership import read_json


def fmt_interval(seconds: float | None) -> str:
    """``00:26``, ``03:10``, ``1:02:03``, ``3d 4:05:06`` (tqdm's format, with days); ``?`` if unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    days, rest = divmod(int(seconds), 86400)
    return f"{days}d {tqdm.format_interval(rest)}" if days else tqdm.format_interval(rest)


def read_progress(run_dir: Path) -> dict:
    """The run's ``progress.json`` ({} before its first write)."""
    return read_json(run_dir / PROGRESS_FILE)


def describe_progress(progress: dict) -> str:
    """``step 120/200 (60%), loss 1.734, 3.1 steps/s, eta 00:26``; testing: ``testing, batch 3/8``, or in a named
    phase ``testing: sampling 250/500 (50%), 3.9/s, eta 01:04``."""
    if not progress:
        return "starting"
    step, total = progress.get("step", 0), progress.get("total")
    if progress.get("stage") == "test" and not progress.get("phase"):
        return f"testing, batch {step}/{total if total else '?'}"
    count = f"{step:,}/{total:,} ({100 * step / total:.0f}%)" if total else f"{step:,}"
    if progress.get("stage") == "test":  # a named phase (a DiT's sampling, its features ...), in its own units
        parts = [f"testing: {progress['phase']} {count}"]
        if progress.get("steps_per_s"):
            parts.append(f"{progress['steps_per_s']:.3g}/s")
        if progress.get("status", "running") == "running" and progress.get("eta_s") is not None:
            parts.append(f"eta {fmt_interval(progress['eta_s'])}")
        return ", ".join(parts)
    parts = [f"step {count}"]
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4g}")
    if progress.get("steps_per_s"):
        parts.append(f"{progress['steps_per_s']:.3g} steps/s")
    if progress.get("status", "running") == "running":
        parts.append(f"eta {fmt_interval(progress.get('eta_s'))}")
    return ", ".join(parts)


def remaining_seconds(progress: dict, stale_after_s: float | None = None) -> float | None:
    """Seconds the run still needs by its own estimate (None if unknown or its file is stale)."""
    eta = progress.get("eta_s")
    if eta is None or progress.get("stage") == "test":
        return None
    if stale_after_s is not None and time.time() - progress.get("updated", 0) > stale_after_s:
        return None
    return max(0.0, eta - (time.time() - progress.get("updated", time.time())))


def run_duration(progress: dict) -> float | None:
    """A run's whole fit time as its progress file implies it (total steps / steps per second)."""
    rate, total = progress.get("steps_per_s"), progress.get("total")
    return total / rate if rate and total else None


def grid_eta(remaining: list[float | None], durations: list[float], waiting: int, parallel: int) -> float | None:
    """When the grid should end: the running runs' ETAs plus the waiting runs at a typical run's duration.

    Args:
        remaining: seconds each running run still needs (None where unknown).
        durations: whole-run durations measured so far (finished runs, or running runs' estimates).
        waiting: runs not started yet.
        parallel: runs at once.
    """
    known = [r for r in remaining if r is not None]
    if len(known) < len(remaining) or (waiting and not durations):
        return None
    typical = statistics.median(durations) if durations else 0.0
    work = sum(known) + waiting * typical  # run-seconds left
    return max(max(known, default=0.0), work / max(1, parallel))


@dataclass
class GridProgress:
    """What the sweep knows about its runs while it goes: which run, its tag, started/ended when."""

    name: str
    sweep_dir: Path
    tags: dict[str, str]  # run name -> "[i/n] name"
    parallel: int
    running: dict[str, float] = field(default_factory=dict)  # run name -> monotonic start
    durations: list[float] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)  # done before this sweep started: neither run nor waiting
    held: set[str] = field(default_factory=set)  # in use by another sweep or command: that one runs them
    lock: threading.Lock = field(default_factory=threading.Lock)

    def started(self, run: str) -> None:
        with self.lock:
            self.running[run] = time.monotonic()

    def skip(self, run: str) -> None:
        with self.lock:
            self.skipped.add(run)

    def hold(self, run: str) -> None:
        with self.lock:
            self.held.add(run)

    def finished(self, run: str, ran: bool) -> None:
        """``ran``: the run trained here (its wall time counts towards the typical duration)."""
        with self.lock:
            start = self.running.pop(run, None)
            if ran and start is not None:
                self.durations.append(time.monotonic() - start)
            self.ended.add(run)

    def report(self) -> list[str]:
        """A line per running run and one for the grid."""
        with self.lock:
            running, durations = dict(self.running), list(self.durations)
            waiting = len(self.tags) - len(self.ended) - len(self.skipped) - len(self.held) - len(running)
            before = f" (+{len(self.skipped)} done before)" if self.skipped else ""
            held = f", {len(self.held)} in use elsewhere" if self.held else ""
        lines, remaining = [], []
        for run in running:
            progress = read_progress(self.sweep_dir / run)
            lines.append(f"{self.tags[run]}: {describe_progress(progress)}")
            remaining.append(remaining_seconds(progress))
            if (duration := run_duration(progress)) is not None and progress.get("stage") != "test":
                durations.append(duration)
        eta = grid_eta(remaining, durations, waiting, self.parallel)
        lines.append(
            f"sweep {self.name}: {len(self.ended)} done{before}, {len(running)} running{held}, {waiting} waiting; "
            f"eta {fmt_interval(eta)} (grid)"
        )
        return lines


class Reporter(threading.Thread):
    """Prints :meth:`GridProgress.report` every ``every_s`` seconds while runs train (a daemon thread)."""

    def __init__(self, progress: GridProgress, every_s: float, emit: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name=f"progress-{progress.name}")
        self.progress, self.every_s, self.emit = progress, every_s, emit
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            if self.progress.running:
                for line in self.progress.report():
                    self.emit(line)

    def stop(self) -> None:
        self.stopped.set()
