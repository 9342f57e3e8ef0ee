"""User-facing errors: one line naming the bad value, exit status 2, no traceback (``--debug`` shows it).

``python -m experiments`` funnels every exception through :func:`describe`:

    exception ──> describe() ──> (exit status, one-line message)   user error, interrupt
                           └──> None                                a bug: the traceback is shown

User errors are this module's ``SuiteError`` family, the ``ValueError`` / ``FileNotFoundError`` the
configs and data readers raise with readable messages, jsonargparse's parse errors and Lightning's
``MisconfigurationException``. jsonargparse wraps a constructor's error in a long multi-line report
("Does not validate against any of the Union subtypes ... Given value: Namespace(...)");
:func:`jsonargparse_line` digs out the line that names the problem.
"""

from __future__ import annotations

import argparse
import errno
import re

USAGE_ERROR = 2  # argparse's status for bad input
SIGINT_EXIT = 130  # 128 + SIGINT, what shells report for Ctrl-C
SIGTERM_EXIT = 143  # 128 + SIGTERM


class SuiteError(Exception):
    """An error about the user's input or environment whose message is already one readable line."""


class CheckpointError(SuiteError):
    """A checkpoint is missing, truncated or corrupt, or does not fit the configured model."""


class OutputDirError(SuiteError):
    """The run directory cannot be created or written (a file in the way, read-only, disk full)."""


class UsageExit(SuiteError, SystemExit):
    """A :class:`SuiteError` that is also a ``SystemExit``, for a tool that may run outside ``python -m
    experiments`` too (``python -m experiments.bench``): there Python prints ``error: <message>`` and exits,
    with no traceback; through ``python -m experiments`` it is the usual one line with exit status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = f"error: {message}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the suite's tools: a bad or missing option raises :class:`UsageExit` (one ``error:`` line,
    exit status 2, through ``python -m experiments``) instead of printing the usage block and exiting itself.

        ArgumentParser(prog="python -m experiments bench").parse_args(["--nope"])
        -> UsageExit("unrecognized arguments: --nope; see python -m experiments bench --help")
    """

    def error(self, message: str) -> None:
        raise UsageExit(f"{message}; see {self.prog} --help")


# Errors of the operating system that are about the user's environment, not about the code.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.ENOTDIR}

# Lines of jsonargparse's reports that carry no information about the actual problem.
_NOISE = re.compile(
    r"^(Does not validate against any of the Union subtypes|Subtypes:|Errors:|Given value type:|Given value:"
    r"|Expected a <class 'NoneType'>|Not a valid subclass of|Subclass types expect one of|tip: )"
)
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)':\s*(.*)$")


def jsonargparse_line(text: str) -> str:
    """The informative line of a jsonargparse error report, prefixed by the parser key it concerns.

    >>> jsonargparse_line('Parser key "trainer.max_steps":\\n  Expected a <class \\'int\\'>. Got value: abc')
    'trainer.max_steps: expected int, got abc'
    """
    keys: list[str] = []
    reasons: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        line = line[2:].strip() if line.startswith("- ") else line
        if not line or _NOISE.match(line):
            continue
        if match := _PARSER_KEY.match(line):
            keys.append(match[1])
            line = match[2]
        elif match := _CLASS_PATH.match(line):
            line = match[2]
        if line and not _NOISE.match(line):
            reasons.append(line)
    # In a Union report "Expected a <class 'str'>" only says the value was not the other alternative.
    specific = [r for r in reasons if not re.fullmatch(r"Expected a <class '[\w.]+'>\.?", r)]
    reasons = specific or reasons
    reason = reasons[0] if reasons else text.strip().splitlines()[0]
    reason = re.sub(r"Expected a <class '([\w.]+)'>\. Got value: (.*)$", r"expected \1, got \2", reason)
    reason = re.sub(r"<class '([\w.]+)'>", r"\1", reason)
    key = ".".join(dict.fromkeys(keys))  # nested reports repeat the outer key
    return f"{key}: {reason}" if key and not reason.startswith(key) else reason


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    if "Does not validate against any of the Union subtypes" in text or text.startswith("Parser key"):
        return jsonargparse_line(text)
    first = text.splitlines()[0] if text else type(exc).__name__
    return first.strip()


def _is_user_error(exc: BaseException) -> bool:
    from jsonargparse import ArgumentError
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if isinstance(exc, SuiteError | ArgumentError | MisconfigurationException | ValueError):
        return True
    if isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError | PermissionError):
        return True
    if isinstance(exc, OSError) and exc.errno in _ENVIRONMENT_ERRNOS:
        return True
    # jsonargparse reports a constructor's TypeError in the same wrapped form
    return isinstance(exc, TypeError) and "Does not validate against any of the Union subtypes" in str(exc)


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def free_space_note(path: object) -> str:
    """``" (1.2 GiB free on its file system)"`` for the nearest existing folder of ``path``; "" if unknown."""
    import shutil
    from pathlib import Path

    if path is None:
        return ""
    for folder in [Path(str(path)), *Path(str(path)).parents]:
        try:
            if folder.is_dir():
                free = float(shutil.disk_usage(folder).free)
                break
        except OSError:
            return ""
    else:
        return ""
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while free >= 1024 and len(units) > 1:
        free, units = free / 1024, units[1:]
    return f" ({free:.1f} {units[0]} free on its file system)"


def describe(exc: BaseException) -> tuple[int, str] | None:
    """Exit status and one-line message for a user error or an interrupt; None for anything else.

    A SIGTERM/SIGINT stop reports the interrupted checkpoint from the exception's notes
    (:class:`experiments.reliability.checkpointing.InterruptCheckpoint` adds them).
    """
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    if isinstance(exc, SIGTERMException):
        notes = getattr(exc, "__notes__", None)
        message = notes[-1] if notes else "interrupted by SIGTERM"
        return (SIGINT_EXIT if "SIGINT" in message else SIGTERM_EXIT), message
    if isinstance(exc, KeyboardInterrupt) or (
        isinstance(exc, SystemExit) and isinstance(exc.__context__, KeyboardInterrupt)
    ):
        interrupt = exc if isinstance(exc, KeyboardInterrupt) else exc.__context__
        notes = getattr(interrupt, "__notes__", None)
        return SIGINT_EXIT, notes[-1] if notes else "interrupted by SIGINT (Ctrl-C)"
    if isinstance(exc, SystemExit) and not isinstance(exc, SuiteError):  # (a UsageExit is both)
        return None
    if not _is_user_error(exc):
        return None
    if isinstance(exc, OSError) and exc.strerror:  # raised by the OS: "[Errno 28] ..." reads better without the number
        where = f": {exc.filename!s}" if exc.filename else ""
        free = free_space_note(exc.filename) if exc.errno in DISK_FULL else ""
        return USAGE_ERROR, f"{exc.strerror}{where}{free}"
    return USAGE_ERROR, _first_line(exc)
