"""Runs ``python -m experiments ARGV`` and SIGKILLs it in the middle of writing one file: a crash at a chosen moment.

    python tests/experiments/kill_inside_write.py PATTERN N REPORT -- fit -c ...

Every file the suite writes durably is fsynced before it goes live (``fileio.atomic``; torch's sharded
checkpoint writer fsyncs each shard). At the N-th ``os.fsync`` of a file whose path matches the regular
expression PATTERN, this cuts the file to half its length (the part a writer killed mid-write would have put
down), writes REPORT (JSON: the file being written, the live file it would replace, and that file's sha256
right now), then kills its own process with SIGKILL: no handler, no ``finally`` block, no cleanup runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
from pathlib import Path


def live_name(path: Path) -> Path:
    """The file a temp file becomes: ``.<name>.<pid>.<random>.tmp`` -> ``<name>``; a shard: its folder's target."""
    for part in path.parents:
        if part.name.endswith(".partial"):  # .<name>.save.<random>.partial/<shard>
            return part.with_name(part.name[1:].split(".save.")[0])
    return path.with_name(path.name[1:].rsplit(".", 3)[0])


def digest(path: Path) -> str | None:
    """sha256 of a file, or of a folder's files (names and bytes, sorted); None if it does not exist."""
    if not path.exists():
        return None
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    sha = hashlib.sha256()
    for file in files:
        sha.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + file.read_bytes())
    return sha.hexdigest()


def main() -> None:
    pattern, count, report = re.compile(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    real_fsync, seen = os.fsync, [0]

    def fsync(fd: int) -> None:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return real_fsync(fd)
        if pattern.search(str(path)):
            seen[0] += 1
            if seen[0] == count:
                size = os.fstat(fd).st_size
                os.ftruncate(fd, size // 2)
                live = live_name(path)
                report.write_text(json.dumps({"writing": str(path), "live": str(live), "sha256": digest(live)}))
                os.kill(os.getpid(), signal.SIGKILL)
        return real_fsync(fd)

    os.fsync = fsync
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, as for python -m experiments
    from experiments.__main__ import main as experiments_main

    sys.exit(experiments_main(argv))


if __name__ == "__main__":
    main()
