"""One command at a time per run directory: a lock that the kernel releases when its holder exits.

    runs/lm/tiny/pre/           the run directory
    runs/lm/tiny/.pre.lock      flock()ed by the command writing the run; holds JSON naming that command

``fit``, ``validate``, ``test`` and ``predict`` take the lock before they write anything (config files, events,
checkpoints, ``summary.json``) and keep it until they return, so two commands never interleave their writes in
one run directory: the second stops at once with one line naming the directory and the holder's pid.

The lock is ``flock`` on an open file, not the file's existence: the kernel drops it when the holding process
ends, however it ends (an exception, SIGKILL, an OOM kill), so a crashed ``fit`` never leaves its run locked
and ``--ckpt_path last`` resumes it right away. The file stays behind, empty of meaning until someone locks it
again. It lives beside the run directory rather than in it, so ``fit --overwrite`` can move the old directory
away while it holds the lock. Under DDP only global rank 0 takes it: the other ranks are the same run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import IO

from experiments.reliability.errors import OutputDirError

_HELD: dict[str, IO[str]] = {}  # lock file -> its open handle, for as long as this process holds it
# File systems that cannot lock (some NFS mounts) say so with these: the run goes on, unguarded, with a warning.
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


def lock_path(run_dir: Path) -> Path:
    """``<parent>/.<run name>.lock``: the lock file of ``run_dir``."""
    return run_dir.parent / f".{run_dir.name}.lock"


def _holder(handle: IO[str]) -> str:
    """Who holds the lock, as its JSON says: ``fit (pid 123 on host, since 2026-01-01T10:00:00)``."""
    with contextlib.suppress(OSError, ValueError, TypeError):  # unreadable, or not the JSON object we write
        handle.seek(0)
        info = {"command": "?", "pid": "?", "host": "?", "since": "?", **json.loads(handle.read() or "{}")}
        return f"{info['command']} (pid {info['pid']} on {info['host']}, since {info['since']})"
    return "another process"


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
        handle = open(path, "a+")  # noqa: SIM115 - held until the command ends (release_run_locks)
    except OSError as err:
        raise OutputDirError(f"cannot write to run directory {run_dir}: {err.strerror or err}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        handle.close()
        raise OutputDirError(
            f"run directory {run_dir} is in use by {holder}; valid: wait for it to end or stop it, "
            "or write elsewhere with --run_name NEW"
        ) from None
    except OSError as err:
        if err.errno not in _NO_LOCKING:
            handle.close()
            raise
        warnings.warn(
            f"{path}: this file system cannot lock files; nothing stops two commands in {run_dir}", stacklevel=2
        )
    _HELD[key] = handle


def record_holder(run_dir: Path, command: str) -> None:
    """Writes who holds the lock of ``run_dir`` into it (what a refused second command names)."""
    handle = _HELD.get(str(lock_path(Path(run_dir)).absolute()))
    if handle is None:
        return
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"command": command, "pid": os.getpid(), "host": socket.gethostname(), "since": since}))
    handle.flush()


def release_run_locks() -> None:
    """Releases every run lock this process holds (closing the file drops the flock; the file stays)."""
    while _HELD:
        _, handle = _HELD.popitem()
        with contextlib.suppress(OSError):
            handle.close()
