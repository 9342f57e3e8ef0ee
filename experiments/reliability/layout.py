"""Where runs live, and what a run may touch: ``<root>/<task>/<experiment>/<run_name>/``.

    root        --trainer.default_root_dir if given (Lightning's switch), else --runs_root ("runs")
    task        lm | vit | dit | vae, from the model class
    experiment  --experiment, else the first config's file name (configs/lm/tiny.yaml -> tiny)
    run_name    --run_name, else the norm scheme

``experiment`` and ``run_name`` are single path components of safe characters (``check_name``), so a run
directory is always inside its root. A run directory the suite made holds :data:`RUN_MARKER`; only such a
directory is ever cleared (``fit --overwrite``), and a ``fit`` never writes over another run's
checkpoints unasked (:func:`claim_run_dir`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from experiments.reliability.errors import OutputDirError, SuiteError

TASK_NAMES: dict[str, str] = {
    "LanguageModeling": "lm",
    "ImageClassification": "vit",
    "LatentDiffusion": "dit",
    "AutoencoderTraining": "vae",
}
RUN_MARKER = ".suite-run"  # JSON: which command made the directory, and when
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,127}")
NAME_RULE = "1-128 characters of letters, digits and . _ + = -, starting with a letter or digit"
# What a finished or started fit leaves in its run directory; any of these means "this directory holds a run".
RUN_ARTIFACTS = ("checkpoints", "summary.json", "config.yaml")


def task_name(class_path: str) -> str:
    """The short task name of a model class: its ``task`` attribute (a subclass keeps its task), else by name."""
    module, _, name = class_path.rpartition(".")
    try:
        task = getattr(getattr(importlib.import_module(module), name), "task", None)
    except (ImportError, AttributeError, ValueError):
        task = None
    return task if isinstance(task, str) else TASK_NAMES.get(name, name.lower())


def check_name(option: str, value: str) -> str:
    """Returns ``value`` if it is one safe path component; a one-line :class:`SuiteError` otherwise.

    >>> check_name("--run_name", "siamese-lr0.01")
    'siamese-lr0.01'
    """
    if not NAME_PATTERN.fullmatch(value):
        raise SuiteError(f"{option}={value!r} is not a valid name; valid: {NAME_RULE} (one directory level)")
    return value


def run_dir_for(root: str | Path, task: str, experiment: str, run_name: str) -> Path:
    """``<root>/<task>/<experiment>/<run_name>`` after checking that both names are one path component."""
    return Path(root) / task / check_name("experiment", experiment) / check_name("run_name", run_name)


def trainer_run_dir(trainer) -> str | None:
    """The run directory of a Trainer, read from its logger: what ``Trainer.log_dir`` returns, without its
    broadcast. ``Trainer.log_dir`` is a collective under DDP, so code that only some ranks reach (rank zero,
    an exception on one rank) would wait on it forever; this is safe anywhere."""
    logger = trainer.logger
    where = getattr(logger, "log_dir", None) if logger is not None else None
    return str(where) if where else trainer.default_root_dir


def run_dir_of_checkpoint(ckpt: str | Path) -> Path | None:
    """The run directory of ``<run>/checkpoints/<file>.ckpt`` if it is one the suite made, else None."""
    path = Path(ckpt)
    run = path.parent.parent
    return run if path.parent.name == "checkpoints" and (run / RUN_MARKER).is_file() else None


def run_dir_of_config(config: str | Path) -> Path | None:
    """The run directory a saved ``config*.yaml`` sits in (one the suite made), else None: where an
    evaluation from that config writes when nothing else names a place."""
    path = Path(config)
    run = path.parent
    return run if path.name.startswith("config") and (run / RUN_MARKER).is_file() else None


def held_artifacts(run_dir: Path) -> list[str]:
    """The run artifacts already in ``run_dir`` (checkpoints, summary.json, config.yaml), by name."""
    found = []
    for name in RUN_ARTIFACTS:
        path = run_dir / name
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            found.append(f"{name}/" if path.is_dir() else name)
    return found


def mark(run_dir: Path, command: str) -> None:
    """Records that the suite made ``run_dir`` (kept if it exists: the first command that made it)."""
    marker = run_dir / RUN_MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"made_by": command, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def claim_run_dir(run_dir: Path, resuming: bool, overwrite: bool) -> None:
    """Lets a ``fit`` write into ``run_dir``: fresh, resumed from (``--ckpt_path``), or replaced on request.

    Raises:
        OutputDirError: the directory holds another run and neither resuming nor ``--overwrite`` was asked,
            or ``--overwrite`` was asked for a directory the suite did not make.
    """
    held = held_artifacts(run_dir) if run_dir.is_dir() else []
    if not held or resuming:
        return
    if not overwrite:
        raise OutputDirError(
            f"run directory {run_dir} already holds a run ({', '.join(held)}); valid: --ckpt_path last to resume "
            "it, --run_name NEW for a new run beside it, or --overwrite to replace it"
        )
    clear_run_dir(run_dir)


def refuse_link(path: Path, what: str) -> None:
    """A one-line :class:`OutputDirError` when ``path`` is a symbolic link: the suite never clears through one
    (renaming the link would leave the user's data where it points, and deleting it would follow it)."""
    if path.is_symlink():
        raise OutputDirError(
            f"--overwrite: {what} {path} is a symbolic link (to {os.readlink(path)}); it is left as it is: "
            "replace its contents yourself, or choose another --run_name"
        )


def clear_run_dir(run_dir: Path) -> None:
    """Deletes a run directory the suite made (it holds :data:`RUN_MARKER`); refuses any other directory."""
    refuse_link(run_dir, "run directory")
    if not (run_dir / RUN_MARKER).is_file():
        raise OutputDirError(
            f"--overwrite: {run_dir} was not made by the suite (no {RUN_MARKER} in it); it is left as it is: "
            "remove it yourself or choose another --run_name"
        )
    # Renamed first, so a crash halfway leaves either the old run or nothing under the run's name.
    trash = run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")
    os.replace(run_dir, trash)
    shutil.rmtree(trash)


def refuse_existing(paths: list[Path], overwrite: bool, what: str) -> None:
    """A one-line :class:`OutputDirError` when any of ``paths`` exists (a non-empty directory) unless ``overwrite``."""
    existing = [p for p in paths if p.is_file() or (p.is_dir() and any(p.iterdir()))]
    if existing and not overwrite:
        names = ", ".join(str(p) for p in existing)
        raise OutputDirError(f"{what} would overwrite {names}; valid: --overwrite to replace, or another output")


def clear_output_dir(output_dir: Path) -> None:
    """Clears an output directory inside the run (``--overwrite``): renamed away first, then deleted."""
    refuse_link(output_dir, "output directory")
    trash = output_dir.with_name(f".{output_dir.name}.replaced-{os.getpid()}")
    os.replace(output_dir, trash)
    shutil.rmtree(trash)


def ensure_writable(run_dir: Path) -> None:
    """Creates ``run_dir`` and writes a probe into it; a one-line :class:`OutputDirError` if that fails."""
    for parent in [run_dir, *run_dir.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise OutputDirError(f"cannot create run directory {run_dir}: {parent} is a file, not a directory")
            break
    probe = run_dir / f".write-probe-{os.getpid()}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"\0" * (1 << 20))  # 1 MiB: a full disk fails here, not at the first checkpoint
    except OSError as err:
        raise OutputDirError(f"cannot write to run directory {run_dir}: {err.strerror or err}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
