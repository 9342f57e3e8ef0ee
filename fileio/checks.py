"""Checks on what a user hands in, shared by every command: numbers, new files, output directories, JSON, text.

    number("1e400", "budget.tokens", where="command line")     -> InputError: not a finite number
    new_file("stats.npz", "--save-real-stats")                 -> the path, or InputError: exists / under a file
    output_dir("docs/results/x", "--export")                   -> the path, or InputError: a file is in the way
    read_json(path, "summary.json", expect=dict)               -> the object, or InputError: wrong shape / too deep
    utf8_text(prompt, "data.init_args.prompts[0]")             -> the text, or InputError: bytes that are not UTF-8

Each check runs before any expensive work and fails with one :class:`InputError` line that names the value,
where it came from and what would be valid. ``InputError`` is a ``ValueError``, so every command line of the
suite already reports it as ``error: ...`` with exit status 2. Nothing here writes a file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 256 << 20  # a summary.json with long curves is a few MB, the largest tokenizer.json ~20 MB
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "true/false", type(None): "null"}


class InputError(ValueError):
    """A value, file or path a user gave that the suite cannot use; the message is one readable line."""


class NotJSONError(InputError):
    """A file that is not JSON text at all (e.g. cut short by a hard kill), as opposed to JSON of a wrong shape."""


def _origin(where: str | None) -> str:
    return f" ({where})" if where else ""


##################################################################################
#                                   Numbers                                      #
##################################################################################


def _bound(value: float) -> str:
    """A bound as a user types it: whole numbers in full (``4294967295``, not ``4.29497e+09``), others ``:g``."""
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e18 else f"{value:g}"


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_bound(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_bound(high)}")
    return " and ".join(parts)


def number(
    value: object,
    what: str,
    *,
    kind: type = float,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    where: str | None = None,
) -> int | float:
    """A finite int or float from a number or a string (``"1e-3"``, ``"2_000"``), range-checked.

    ``inf``, ``nan`` and strings that overflow to them (``"1e400"``) are refused: no count, rate or size the
    suite reads is infinite. ``kind=int`` takes whole numbers in any spelling (``"2e9"``, ``1000.0``).

    >>> number("2e9", "budget.tokens", kind=int)
    2000000000

    Raises:
        InputError: ``"<what>=<value> is not a finite number (<where>); valid: ..."`` and the like.
    """
    kind_name = "integers" if kind is int else "numbers"
    valid = _bounds(low, high, low_open, high_open)
    valid = f"finite {kind_name}" + (f" {valid}" if valid else "")
    raw = value
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InputError(f"{what}={raw!r} is not a number{_origin(where)}; valid: {valid}")
    if isinstance(value, str):
        try:
            value = float(value.strip().replace("_", "")) if not _is_int_text(value) else int(value.strip())
        except ValueError:
            raise InputError(f"{what}={raw!r} is not a number{_origin(where)}; valid: {valid}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{what}={raw!r} is not a finite number{_origin(where)}; valid: {valid}")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise InputError(f"{what}={raw!r} is not a whole number{_origin(where)}; valid: integers")
        value = int(value)
    else:
        try:
            value = float(value)
        except OverflowError:  # an integer too large for a float
            raise InputError(f"{what}={raw!r} is not a finite number{_origin(where)}; valid: {valid}") from None
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        raise InputError(f"{what}={raw!r} must be {_bounds(low, high, low_open, high_open)}{_origin(where)}")
    return value


def _is_int_text(text: str) -> bool:
    stripped = text.strip().replace("_", "")
    return stripped.lstrip("+-").isdigit()


##################################################################################
#                                     Paths                                      #
##################################################################################


def _blocker(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` if it is not a directory (so ``path`` cannot be made)."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def output_dir(path: str | Path, what: str) -> Path:
    """A directory the command may create or write into: not a file, not under a file, writable.

    Raises:
        InputError: one line naming ``what``, the path and the file in the way.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path} is a file, not a directory; valid: a directory path")
    if (blocker := _blocker(path)) is not None:
        raise InputError(f"{what} {path} lies under {blocker}, which is a file; valid: a path under directories")
    existing = next((p for p in [path, *path.parents] if p.exists()), Path("."))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{what} {path}: {existing} is not writable; valid: a directory you can write to")
    return path


def new_file(path: str | Path, what: str, overwrite: bool = False) -> Path:
    """A file path the command may write: not a directory, not under a file, and new unless ``overwrite``.

    Raises:
        InputError: one line naming ``what`` and the path, with ``--overwrite`` as the way out when it exists.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} {path} is a directory; valid: a file path")
    if (path.exists() or path.is_symlink()) and not overwrite:
        raise InputError(f"{what} {path} exists; valid: another path, or --overwrite to replace it")
    if (blocker := _blocker(path)) is not None:
        raise InputError(f"{what} {path} lies under {blocker}, which is a file; valid: a path under directories")
    output_dir(path.parent, what)
    return path


##################################################################################
#                                 File contents                                  #
##################################################################################


def json_type(value: object) -> str:
    """``"an object"``, ``"an array"``, ``"a number"`` ...: how a JSON value is named in messages."""
    return next((name for t, name in JSON_TYPES.items() if type(value) is t), "a number")


def read_json(path: str | Path, what: str, expect: type = dict, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Reads a JSON file a user handed in, refusing (in one line) what would crash or stall the reader.

    Refused: a missing file, one over ``max_bytes``, bytes that are not UTF-8, text that is not JSON, nesting
    deep enough to exhaust Python's recursion, and a top-level value that is not an ``expect``.

    Raises:
        NotJSONError: the text is not JSON (an :class:`InputError`).
        InputError: ``"<what> <path> holds an array, not an object"`` and the like.
    """
    path = Path(path)
    wanted = JSON_TYPES.get(expect, "a number")
    if path.is_file() and (size := path.stat().st_size) > max_bytes:
        raise InputError(f"{what} {path} is {size:,} bytes; valid: a JSON file of at most {max_bytes:,} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
        value = json.loads(text)
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a directory; valid: a JSON file") from None
    except UnicodeDecodeError as err:
        raise NotJSONError(f"{what} {path} is not UTF-8 text (byte {err.start}); valid: a JSON file") from None
    except RecursionError:
        raise InputError(f"{what} {path} is nested too deeply to read; valid: {wanted} of plain values") from None
    except ValueError as err:  # JSONDecodeError, or an integer of more digits than Python converts
        reason = str(err).splitlines()[0][:120]
        raise NotJSONError(f"{what} {path} is not valid JSON ({reason}); valid: {wanted}") from None
    if not isinstance(value, expect) or (expect is not bool and isinstance(value, bool)):
        raise InputError(f"{what} {path} holds {json_type(value)}, not {wanted}")
    return value


def utf8_text(value: str, what: str) -> str:
    """``value`` if it encodes as UTF-8; bytes that are not (e.g. from a command line in another encoding,
    which Python keeps as lone surrogates) are named with their position.

    Raises:
        InputError: ``"<what> holds a byte that is not UTF-8 at character N (...); valid: UTF-8 text"``.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        around = value[max(0, err.start - 10) : err.end + 10].encode("utf-8", "backslashreplace").decode()
        raise InputError(
            f"{what} holds a byte that is not UTF-8 at character {err.start} ({around!r}); valid: UTF-8 text"
        ) from None
    return value
