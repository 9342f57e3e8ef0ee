"""Atomic file writes: a reader sees the old file or the new one, never half of either.

    with atomic_file(path) as f:          # f: a binary file at <dir>/.<name>.<pid>.<random>.tmp
        np.savez(f, ...)                  # or torch.save(obj, f), f.write(bytes) ...
    # on leaving the block: f is flushed and fsynced, renamed over `path`, and the directory fsynced;
    # on an exception: the temp file is removed and `path` is untouched

One policy for every file the suite writes (checkpoints, statistics, manifests, progress records, samples):
the data reaches the disk before the rename makes it visible, and the rename reaches the disk before the
writer moves on, so a crash or a full disk never leaves a truncated file under the real name. Temp files
are hidden (a leading dot), unique per process and call, and never end in the target's suffix, so nothing
takes a half-written ``.ckpt`` or ``.npz`` for a finished one.

A folder that is one result (a sharded checkpoint: a file per rank plus metadata) is written the same way:
into :func:`temp_dir` beside it, then :func:`publish_dir` swaps it in with one rename (Linux's
``renameat2(RENAME_EXCHANGE)`` when a folder is already there), so a reader sees the old folder or the new one,
never a mix of their files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(directory: str | Path) -> None:
    """Makes a rename in ``directory`` durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename itself is still atomic
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """A fresh hidden name beside ``path``: ``.<name>.<pid>.<random>.tmp`` (two writers never share one)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_file(path: str | Path, replace: bool = True) -> Iterator[IO[bytes]]:
    """A binary file that replaces ``path`` when the block ends without an exception (module docstring).

    The parent directory is created if missing. The temp file's name is ``f.name`` (to check the file
    before it goes live, e.g. load it back). ``replace=False``: the file goes live only if ``path`` still does
    not exist (a hard link, which fails instead of replacing), so of two processes writing one new output the
    first wins whole and the second is told (:class:`fileio.checks.InputError`), its work discarded.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _publish_new(tmp: Path, path: Path) -> None:
    """Makes ``tmp`` visible as ``path`` unless ``path`` exists by now; removes ``tmp``."""
    from fileio.checks import InputError

    try:
        os.link(tmp, path)
    except FileExistsError:
        raise InputError(
            f"{path} was written by another process while this one worked; it is left as it is (this result is "
            "discarded); valid: another path, or --overwrite to replace it"
        ) from None
    except OSError:  # a file system without hard links: an exclusive create, then the data copied in
        with open(path, "xb") as out, open(tmp, "rb") as src:  # FileExistsError as above if it appeared
            out.write(src.read())
            out.flush()
            os.fsync(out.fileno())
    tmp.unlink()


PARTIAL_SUFFIX = ".partial"  # a folder still being written (or left by a killed writer): never read, never listed


def temp_dir(path: str | Path, tag: str = "") -> Path:
    """A fresh hidden folder name beside ``path`` for building it: ``.<name>.<tag or pid>.<random>.partial``.

    Not created here: in a distributed save every rank writes into it, and one of them publishes it.
    """
    path = Path(path)
    return path.with_name(f".{path.name}.{tag or os.getpid()}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")


def stale_temp_dirs(path: str | Path) -> list[Path]:
    """The :func:`temp_dir` folders of ``path`` that are lying about (a writer was killed before publishing)."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.glob(f".{path.name}.*{PARTIAL_SUFFIX}") if p.is_dir() and not p.is_symlink())


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two existing paths in one atomic step (Linux ``renameat2``); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False  # an old kernel, or a file system without the exchange: the caller falls back
    raise OSError(code, os.strerror(code), str(b))


def publish_dir(tmp: str | Path, path: str | Path) -> None:
    """Makes the finished folder ``tmp`` visible as ``path`` in one rename; the folder it replaces is removed.

    When ``path`` exists, the two are exchanged atomically and the old one (now under ``tmp``'s name) deleted.
    Without the exchange the old folder is moved aside first: a crash between the two renames then leaves the
    previous folder at ``tmp``'s name plus ``.previous``, which :func:`previous_dir` finds. Stale temp folders
    of ``path`` (killed writers) are removed too. Every rename is made durable before this returns.
    """
    tmp, path = Path(tmp), Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()  # a file (a single-process checkpoint of the same name) gives way to the folder
    if not path.exists():
        os.rename(tmp, path)
    elif _exchange(tmp, path):
        shutil.rmtree(tmp)  # the old folder, now under the temp name
    else:
        aside = tmp.with_name(tmp.name + ".previous")
        os.rename(path, aside)
        os.rename(tmp, path)
        fsync_dir(path.parent)
        shutil.rmtree(aside)
    fsync_dir(path.parent)
    for stale in stale_temp_dirs(path):
        shutil.rmtree(stale, ignore_errors=True)
    for aside in path.parent.glob(f".{path.name}.*{PARTIAL_SUFFIX}.previous"):
        shutil.rmtree(aside, ignore_errors=True)  # a previous folder a crashed fallback left, now superseded


def previous_dir(path: str | Path) -> Path | None:
    """The previous folder of ``path`` that a crash inside :func:`publish_dir`'s fallback left aside (if any)."""
    path = Path(path)
    found = sorted(path.parent.glob(f".{path.name}.*{PARTIAL_SUFFIX}.previous"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found and not path.exists() else None


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Writes ``data`` to ``path`` atomically; returns ``path``."""
    with atomic_file(path) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Writes UTF-8 ``text`` to ``path`` atomically; returns ``path``."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, payload: Any, indent: int | None = 2, sort_keys: bool = False) -> Path:
    """Writes ``payload`` as JSON (numpy and torch scalars as floats) plus a newline, atomically."""
    text = json.dumps(payload, indent=indent, sort_keys=sort_keys, default=float) + "\n"
    return atomic_write_text(path, text)
