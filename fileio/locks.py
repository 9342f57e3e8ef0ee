"""Exclusive claims on an output: an ``flock`` on a small file, released by the kernel when its holder exits.

    handle = try_lock(out / ".prepare.lock")     # None: another process holds it (holder(path) says who)
    if handle is None: ...                        # refuse in one line
    write_holder(handle, "prepare_text")          # what a refused second command names
    ...                                           # the work
    unlock(handle, remove=True)                   # the lock file goes too (nothing left in the output)

The lock is the ``flock`` of an open file, not the file's existence, so a holder that crashes (an exception,
SIGKILL, an OOM kill) never leaves a stale claim: the next command takes it at once. A holder that removes the
file does so while it still holds the lock, and a taker checks, once it holds the lock, that the path still
names the file it locked (else it retries), so a remove never lets two processes hold "the" lock at once.
File systems that cannot lock (some NFS mounts) get the claim with a warning, unguarded.
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

# What a file system that cannot lock says: the command goes on, unguarded, with a warning.
NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}
PATIENCE_S = 0.5  # how long a taker waits out a momentary holder: a reader that only asks whether it is held
PROBE_S = 0.05  # how long a reader that only asks waits out another reader asking at the same moment


def try_lock(path: str | Path, wait_s: float = PATIENCE_S) -> IO[str] | None:
    """Takes the exclusive lock of ``path`` (created if missing, its content kept); None when another process
    holds it for longer than ``wait_s`` seconds. The open handle is the lock: keep it until the claim ends
    (:func:`unlock`). The short wait rides out a reader that only asks whether the lock is held (it takes the
    lock for microseconds); a real holder keeps it for as long as its command runs.

    Raises:
        OSError: the file cannot be created or opened (a missing directory, no permission).
    """
    path = Path(path)
    deadline = time.monotonic() + wait_s
    for _ in range(100):  # each retry means a holder removed the file between our open and our lock
        handle = open(path, "a+")  # noqa: SIM115 - the caller holds it for as long as the claim lasts
        try:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.005)
        except BlockingIOError:
            handle.close()
            return None
        except OSError as err:
            if err.errno not in NO_LOCKING:
                handle.close()
                raise
            warnings.warn(f"{path}: this file system cannot lock files; nothing stops two commands", stacklevel=2)
            return handle
        with contextlib.suppress(OSError):
            if os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino:
                return handle
        handle.close()  # we locked a file its holder removed meanwhile: lock the one the path names now
    raise OSError(errno.EAGAIN, f"{path} keeps being replaced; cannot lock it")


def write_holder(handle: IO[str], command: str) -> None:
    """Records who holds the lock (JSON: command, pid, host, since) for a refused second command to name."""
    since = time.strftime("%Y-%m-%dT%H:%M:%S")
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"command": command, "pid": os.getpid(), "host": socket.gethostname(), "since": since}))
    handle.flush()


def holder(path: str | Path) -> str:
    """Who holds the lock of ``path``, as its JSON says: ``fit (pid 123 on host, since 2026-01-01T10:00:00)``."""
    with contextlib.suppress(OSError, ValueError, TypeError):  # unreadable, or not the JSON object we write
        text = Path(path).read_text()
        if text.strip():  # empty: taken a moment ago, its holder not written yet
            info = {"command": "?", "pid": "?", "host": "?", "since": "?", **json.loads(text)}
            return f"{info['command']} (pid {info['pid']} on {info['host']}, since {info['since']})"
    return "another process"


def claim_output(out: str | Path, lock_name: str, command: str, when_done: str) -> IO[str]:
    """Takes the lock ``out/lock_name`` for ``command`` (a tool writing ``--out``) and records it as the holder.

    Raises:
        InputError: another process holds it: one line naming the holder and what to do (``when_done``: what
            the same command finds once the holder has ended), nothing changed.
    """
    from fileio.checks import InputError

    path = Path(out) / lock_name
    handle = try_lock(path)
    if handle is None:
        raise InputError(
            f"--out {str(out)!r} is being written by {holder(path)} (command line); valid: wait for it to end "
            f"(the same command then {when_done}), stop it, or another --out"
        )
    write_holder(handle, command)
    return handle


def unlock(handle: IO[str], remove: bool = False) -> None:
    """Ends the claim; ``remove``: the lock file is deleted first, while it is still held."""
    if remove:
        with contextlib.suppress(OSError):
            os.unlink(handle.name)
    with contextlib.suppress(OSError):
        handle.close()
