"""fileio.locks: one holder at a time, named to the others; a removed lock file never lets two hold it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from fileio import locks


def test_one_holder_at_a_time_named_to_the_others(tmp_path: Path):
    path = tmp_path / ".out.lock"
    first = locks.try_lock(path)
    assert first is not None and locks.holder(path) == "another process"  # taken, holder not written yet
    locks.write_holder(first, "prepare_text")
    assert locks.try_lock(path) is None  # another open file of this very process is refused too
    assert locks.holder(path).startswith(f"prepare_text (pid {os.getpid()} on ")
    locks.unlock(first, remove=True)
    assert not path.exists()
    again = locks.try_lock(path)
    assert again is not None
    locks.unlock(again)
    assert path.exists()  # kept without remove


def test_a_file_removed_between_open_and_lock_is_not_the_lock(tmp_path: Path, monkeypatch):
    """The holder removed (and a third process recreated) the file after this one opened it: the flock this
    one gets is on a file nobody else will ever look at, so it locks the file the path names now."""
    path = tmp_path / ".out.lock"
    real, calls = fcntl.flock, []

    def removed_meanwhile(handle, operation):
        calls.append(handle.name)
        if len(calls) == 1:
            os.unlink(path)
            path.write_text("")
        return real(handle, operation)

    monkeypatch.setattr(locks.fcntl, "flock", removed_meanwhile)
    handle = locks.try_lock(path)
    assert handle is not None and len(calls) == 2
    assert os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    locks.unlock(handle)
