"""One command at a time per run directory: a lock that the kernel releases when its holder exits.

    runs/lm/tiny/pre/           the run directory
    runs/lm/tiny/.pre.lock      flock()ed by the command writing the run; holds JSON naming that command
    runs/lm/tiny/.pre.sweep.lock    flock()ed by the sweep running the run (its fit and test processes)

``fit``, ``validate``, ``test`` and ``predict`` take the lock before they write anything (config files, events,
checkpoints, ``summary.json``) and keep it until they return, so two commands never interleave their writes in
one run directory: the second stops at once with one line naming the directory and the holder's pid.

The lock is ``flock`` on an open file, not the file's existence: the kernel drops it when the holding process
ends, however it ends (an exception, SIGKILL, an OOM kill), so a crashed ``fit`` never leaves its run locked
and ``--ckpt_path last`` resumes it right away. The file stays behind, empty of meaning until someone locks it
again. It lives beside the run directory rather than in it, so ``fit --overwrite`` can move the old directory
away while it holds the lock. Under DDP only global rank 0 takes it: the other ranks are the same run.

A sweep claims each run before it looks at it (:func:`sweep_claim`) and keeps the claim while the run's fit
and test processes come and go, so two sweeps on one spec never train a run twice: the second skips a run
another sweep or command is using. Readers of results ask :func:`in_use` and list such a run as running
instead of reading it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from experiments.reliability.errors import OutputDirError
from fileio.locks import PROBE_S, holder, try_lock, unlock, write_holder

_HELD: dict[str, IO[str]] = {}  # lock file -> its open handle, for as long as this process holds it


def lock_path(run_dir: Path) -> Path:
    """``<parent>/.<run name>.lock``: the lock file of ``run_dir``."""
    return run_dir.parent / f".{run_dir.name}.lock"


def claim_path(run_dir: Path) -> Path:
    """``<parent>/.<run name>.sweep.lock``: the claim a sweep holds on ``run_dir`` while it runs it."""
    return run_dir.parent / f".{run_dir.name}.sweep.lock"


def acquire_run_lock(run_dir: Path) -> None:
    """Takes the lock of ``run_dir`` for this process (a no-op if it holds it already). Nothing is written into
    the lock file until :func:`record_holder` (after the command's own checks), so a command refused for
    another reason leaves every file as it was.

    Raises:
        OutputDirError: another process holds it (one line naming the directory and the holder), or the
            directory cannot be made (a file in the way).
    """
    path = lock_path(Path(run_dir))
    key = str(path.absolute())
    if key in _HELD:
        return
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise OutputDirError(f"cannot create run directory {run_dir}: {blocker} is a file, not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = try_lock(path)  # a file system that cannot lock: a warning, and the run goes on unguarded
    except OSError as err:
        raise OutputDirError(f"cannot write to run directory {run_dir}: {err.strerror or err}") from None
    if handle is None:
        raise OutputDirError(
            f"run directory {run_dir} is in use by {holder(path)}; valid: wait for it to end or stop it, "
            "or write elsewhere with --run_name NEW"
        )
    _HELD[key] = handle


def record_holder(run_dir: Path, command: str) -> None:
    """Writes who holds the lock of ``run_dir`` into it (what a refused second command names)."""
    handle = _HELD.get(str(lock_path(Path(run_dir)).absolute()))
    if handle is not None:
        write_holder(handle, command)


def release_run_locks() -> None:
    """Releases every run lock this process holds (closing the file drops the flock; the file stays)."""
    while _HELD:
        _, handle = _HELD.popitem()
        unlock(handle)


def in_use(run_dir: Path, claims: bool = True) -> str | None:
    """Who is using ``run_dir`` right now: a command holding its run lock or (``claims``) a sweep holding its
    claim, named as its lock file says; None when nobody is. Only asks: it holds a lock for microseconds (a
    command taking it meanwhile waits that out), and never creates a lock file (a run without one is in use by
    nobody)."""
    paths = [lock_path(Path(run_dir))] + ([claim_path(Path(run_dir))] if claims else [])
    for path in paths:
        if not path.is_file():
            continue
        try:
            handle = try_lock(path, wait_s=PROBE_S)
        except OSError:  # unreadable: it cannot be told, so it is not claimed to be in use
            continue
        if handle is None:
            return holder(path)
        unlock(handle)
    return None


@contextlib.contextmanager
def sweep_claim(run_dir: Path, command: str) -> Iterator[str | None]:
    """Claims ``run_dir`` for this sweep for the block: yields None when this process holds the claim (the
    block runs the run), else who uses the run (the block skips it). A run is in use when another sweep holds
    its claim or any command holds its run lock (a ``fit`` started by hand, or one whose sweep was killed).

    The claim is an ``flock`` like the run lock (:mod:`fileio.locks`): a sweep that dies, however it dies,
    drops it, so nothing stale ever blocks a run. It is separate from the run lock because the run's own
    process (a child of the sweep) takes that one.
    """
    path = claim_path(Path(run_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = try_lock(path)
    if handle is None:
        yield holder(path)
        return
    try:
        write_holder(handle, command)  # first: another sweep refused meanwhile names this one, not a past holder
        yield in_use(run_dir, claims=False)
    finally:
        unlock(handle)
