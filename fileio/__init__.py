"""Files in and out, the same way for every command: atomic writes, and checks on what users hand in.

    atomic.py   write a file so that a reader (or a crash) never sees half of it: temp file beside the target,
                fsync, rename over it, fsync the directory; a folder built beside its target and swapped in
    checks.py   the input checks every command shares: a finite number from a string, a new file, an output
                directory, a JSON file of an expected shape, UTF-8 text; one-line InputError (a ValueError)
    locks.py    an exclusive claim on an output (an flock the kernel releases when its holder exits, however it
                exits) and who holds it, for a second command to name

Belongs here: file handling every other package repeats. Plain Python (and the standard library): it imports
nothing of ``models``, ``datamodules`` or ``experiments``, so each of them can use it.
"""

from fileio.atomic import (
    atomic_file,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    fsync_dir,
    previous_dir,
    publish_dir,
    stale_temp_dirs,
    temp_dir,
)
from fileio.checks import InputError, NotJSONError, new_file, number, output_dir, read_json, utf8_text

__all__ = [
    "InputError",
    "NotJSONError",
    "atomic_file",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_dir",
    "new_file",
    "number",
    "output_dir",
    "previous_dir",
    "publish_dir",
    "read_json",
    "stale_temp_dirs",
    "temp_dir",
    "utf8_text",
]
