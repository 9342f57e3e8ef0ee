"""Checkpoints a run can trust: atomic writes, corrupt-file detection, exact resume, a save on SIGTERM/SIGINT.

    save:    torch.save through fileio.atomic_file: temp file beside it, fsync, rename (never half a file)
    resume:  --ckpt_path last | PATH
               last: the readable *.ckpt of the run with the highest step recorded inside it (global_step; a
                     sharded folder's meta.pt), never the file times (unreadable ones skipped; says which it took;
                     validate / test / predict with nothing to take is an error)
               PATH: that file, or a one-line error naming what is wrong with it (never another file)
               -> read with weights_only=True (experiments.reliability.safe_load): no code runs from it
               -> its state dict must fit the configured model (else: "checkpoint X was trained with ...")
               -> weights, optimizer, LR schedule, loops, callbacks (Lightning)
                  + global RNG states and the train sampler's position in its epoch (ExactResume)
    stop:    SIGTERM / first Ctrl-C -> fit: finish the current step -> <dir>/interrupted.ckpt -> exit 143 / 130
                                    -> validate / test / predict: stop after the current batch (LM generation:
                                       the current token) -> exit 143 / 130

Lightning restores the module, optimizer, schedulers, loop progress and callback states on its own.
It does not restore the global RNG, and it replays a plain DataLoader's epoch from its start; the
:class:`ExactResume` callback covers both, so a resumed CPU run reproduces the uninterrupted losses.
"""

from __future__ import annotations

import random
import signal
import threading
import warnings
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from experiments.reliability.errors import CheckpointError
from experiments.reliability.layout import trainer_run_dir
from experiments.reliability.safe_load import checkpoint_problem, load_checkpoint
from experiments.reliability.sharded import sharded_view
from experiments.reliability.signals import note_stop
from fileio import atomic_file, previous_dir

INTERRUPTED_NAME = "interrupted.ckpt"
LIGHTNING_KEYWORDS = ("best", "hpc")  # ckpt_path values Lightning resolves itself

#################################################################################
#                      Atomic writes, corrupt-file detection                     #
#################################################################################


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that never leaves a partial checkpoint and names a corrupt one in one line.

    Lightning's own save goes through a temp file in the system temp dir (a copy, not a rename, when
    that is another file system) and buffers the whole checkpoint in memory first; this writes the temp
    file next to the target, fsyncs it and renames it over the target, so a crash or a full disk leaves
    the previous checkpoint intact.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec's transaction
        path = Path(path)
        try:
            with atomic_file(path) as f:
                torch.save(checkpoint, f)
        except BaseException as err:
            if isinstance(err, OSError):  # disk full, read-only, a file in the way: one line, old file intact
                raise CheckpointError(
                    f"could not write checkpoint {path}: {err.strerror or err}; the previous checkpoint is untouched"
                ) from err
            raise

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Loads with ``weights_only=True`` always (:func:`experiments.reliability.safe_load.load_checkpoint`)."""
        if "://" in str(path):  # remote: fsspec, still without unpickling code
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        return load_checkpoint(path, map_location=map_location if map_location is not None else "cpu")


def written_at(path: Path) -> float:
    """When a checkpoint was saved: a file's mtime; a sharded folder's ``meta.pt`` (its last file written), since
    the folder's own time also moves when a reader adds the consolidated cache to it. Only breaks ties between
    checkpoints of the same step (:func:`newest_readable`): a copy or a restore from backup resets times."""
    meta = path / "meta.pt"
    return meta.stat().st_mtime if path.is_dir() and meta.is_file() else path.stat().st_mtime


def step_of(checkpoint: dict[str, Any], path: str | Path) -> int:
    """The training step ``checkpoint`` (read from ``path``) records: its ``global_step``, checked.

    Raises:
        CheckpointError: ``checkpoint X: global_step='abc' is not a step count; valid: ...`` (one line).
    """
    step = checkpoint.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"checkpoint {path}: its global_step is {step!r}, not a step count; valid: a whole number >= 0, as "
            "Lightning saves it (was the file edited?)"
        )
    return step


def recorded_step(path: Path) -> int:
    """The step a checkpoint was saved at, read from the file (a sharded folder: its ``meta.pt``), never the clock."""
    return step_of(sharded_view(path) if path.is_dir() else load_checkpoint(path, mmap=True), path)


def _rank(path: Path) -> tuple[int, float]:
    """(recorded step, time written): a checkpoint whose step cannot be read ranks below every other."""
    try:
        step = recorded_step(path)
    except CheckpointError:
        step = -1
    return step, written_at(path)


def _target_of(aside: Path) -> Path:
    """``.<name>.save.<random>.partial.previous`` -> ``<name>``."""
    return aside.with_name(aside.name[1:].split(".save.")[0])


def newest_readable(directory: Path, exclude: Path | None = None) -> Path | None:
    """The readable ``*.ckpt`` in ``directory`` (``exclude`` aside) with the highest recorded step (the
    ``global_step`` inside it; a sharded folder's in its ``meta.pt``), the later written among equal steps.

    Never the file times alone: a run directory copied (``cp -r``, rsync without times, a restore) has times
    in any order, and taking the newest file would resume from an earlier step and train its steps again.
    """
    if not directory.is_dir():
        return None
    # (a sharded save's two-rename fallback killed between its renames leaves the previous folder aside)
    aside = [p for p in directory.glob(".*.ckpt.*.partial.previous") if previous_dir(_target_of(p)) == p]
    readable = [
        p
        for p in [*directory.glob("*.ckpt"), *aside]
        if (exclude is None or p.resolve() != exclude.resolve()) and checkpoint_problem(p) is None
    ]
    return max(readable, key=_rank, default=None)


def resolve_checkpoint(ckpt_path: str, checkpoint_dir: Path, stage: str = "fit") -> str | None:
    """Turns ``--ckpt_path`` into the file to load; "last" is the only value that picks a file itself.

    Args:
        ckpt_path: "last" (the newest readable checkpoint of the run, skipping unreadable ones, and saying
            which file it took), a file (used as given, or an error), or a Lightning keyword.
        checkpoint_dir: the run's checkpoint directory, searched for "last".
        stage: "fit" starts from scratch when "last" finds nothing (as in Lightning); validate, test and
            predict need a trained model, so for them that is an error.

    Returns:
        The path to load, or None when ``fit`` with "last" finds nothing.

    Raises:
        CheckpointError: a named file is missing or unreadable (the message names the newest readable
            checkpoint beside it, if any), or "last" found nothing to evaluate.
    """
    if ckpt_path in LIGHTNING_KEYWORDS or "://" in ckpt_path or ckpt_path.startswith("registry:"):
        return ckpt_path
    if ckpt_path == "last":
        found = newest_readable(checkpoint_dir)
        broken = [p for p in checkpoint_dir.glob("*.ckpt") if checkpoint_problem(p)] if checkpoint_dir.is_dir() else []
        newer_broken = sorted(broken)  # (no step can be read from them: every one is named)
        skipped = f" (skipped unreadable {', '.join(p.name for p in newer_broken)})" if newer_broken else ""
        if found is None and stage != "fit":
            raise CheckpointError(
                f"--ckpt_path last: no readable checkpoint in {checkpoint_dir}{skipped}; {stage} needs a trained "
                "model: give --ckpt_path PATH (or leave --ckpt_path out to evaluate an untrained model)"
            )
        if found is None:
            rank_zero_warn(f"--ckpt_path last: no readable checkpoint in {checkpoint_dir}{skipped}; starting afresh")
            return None
        if found.is_dir() and (problem := checkpoint_problem(found, verify=True)):  # its shards hashed once, here
            raise CheckpointError(f"--ckpt_path last: checkpoint {found} {problem}")
        verb = "resuming from" if stage == "fit" else f"{stage} uses"
        message = f"--ckpt_path last: {verb} {found}{skipped}"
        (rank_zero_warn if newer_broken else rank_zero_info)(message)
        return str(found)
    path = Path(ckpt_path)
    problem = checkpoint_problem(path, verify=True)  # a sharded folder's files hashed against its manifest
    if problem is None:
        return str(path)
    beside = newest_readable(path.parent, exclude=path) if problem != "does not exist" or path.parent.is_dir() else None
    hint = f"; the newest readable checkpoint beside it is {beside} (or --ckpt_path last)" if beside else ""
    raise CheckpointError(f"checkpoint {path} {problem}{hint}")


#################################################################################
#                  A checkpoint from another model shape or scheme               #
#################################################################################


def _flat_hparams(hparams: Any) -> dict[str, Any]:
    """hparams as name -> value, config dataclasses (trunk, optim) flattened into their fields."""
    flat: dict[str, Any] = {}
    for key, value in dict(hparams or {}).items():
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        if isinstance(value, dict):
            if key == "optim":
                continue  # optimizer settings never change a state dict
            flat.update({k: v for k, v in value.items() if not isinstance(v, dict)})
        else:
            flat[key.lstrip("_")] = value  # "_class_path": the task module
    return flat


def check_checkpoint_fits(model: L.LightningModule, path: str) -> None:
    """Raises a one-line :class:`CheckpointError` when ``path``'s weights cannot load into ``model``.

    The message names the hyperparameters that differ, from the checkpoint's saved hparams:
    "checkpoint X was trained with norm_scheme=siamese, dim=64; this config has norm_scheme=pre, dim=32".
    """
    # tensors and plain data only; a sharded checkpoint's shapes come from its metadata, its shards stay unread
    ckpt = sharded_view(path) if Path(path).is_dir() else load_checkpoint(path, mmap=True)
    state = ckpt.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds no 'state_dict'; it is not a Lightning checkpoint")
    step_of(ckpt, path)  # the loops resume from it
    own = model.state_dict()
    strict = getattr(model, "strict_loading", True)
    missing = [k for k in own if k not in state] if strict else []
    unexpected = [k for k in state if k not in own] if strict else []
    reshaped = [k for k in own if k in state and tuple(own[k].shape) != tuple(state[k].shape)]
    saved, current = _flat_hparams(ckpt.get("hyper_parameters")), _flat_hparams(model.hparams)
    differ = [k for k in current if k in saved and saved[k] != current[k]]
    if not (missing or unexpected or reshaped or "norm_scheme" in differ):
        return  # (weights of some schemes fit another's layout: the scheme must still agree)
    counts = f"{len(missing)} missing, {len(unexpected)} unexpected, {len(reshaped)} reshaped tensors"
    if differ:
        shown = differ[:6]
        was = ", ".join(f"{k}={saved[k]}" for k in shown)
        now = ", ".join(f"{k}={current[k]}" for k in shown)
        raise CheckpointError(f"checkpoint {path} was trained with {was}; this config has {now} ({counts})")
    example = (missing or unexpected or reshaped)[0]
    raise CheckpointError(f"checkpoint {path} does not fit this model ({counts}, e.g. {example!r})")


#################################################################################
#                        Exact resume: RNG and data position                     #
#################################################################################


def rng_states() -> dict[str, Any]:
    """The global RNG states (torch, CUDA, numpy, python) in types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "gauss": gauss},
        "python": random.getstate(),
    }  # fmt: skip


def set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    n = states["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(states["python"])


def _train_sampler(trainer: L.Trainer) -> tuple[Any, int, int] | None:
    """(resumable sampler, batch size, world size it is sharded over) of the train loader, if any."""
    loader = trainer.train_dataloader
    if not isinstance(loader, DataLoader) or loader.batch_size is None:
        return None
    sampler, world = loader.sampler, 1
    if isinstance(sampler, DistributedSamplerWrapper):  # Lightning shards it: rank r takes items r, r+W, ...
        # W = data-parallel replicas, not processes: under tensor parallelism a group of ranks reads one share
        sampler, world = sampler.dataset._sampler, sampler.num_replicas
    if not (hasattr(sampler, "state_dict") and hasattr(sampler, "load_state_dict")):
        return None
    return sampler, loader.batch_size, world


def sampler_position(trainer: L.Trainer) -> dict[str, int] | None:
    """The train sampler's state plus where the fit stands: epoch, and samples of it already consumed."""
    found = _train_sampler(trainer)
    if found is None:
        return None
    sampler, batch_size, world = found
    epochs = trainer.fit_loop.epoch_progress.current
    done = trainer.fit_loop.epoch_loop.batch_progress.current.processed  # batches trained this epoch
    epoch, offset = trainer.current_epoch, done * batch_size * world
    if epochs.started == epochs.completed or done >= trainer.num_training_batches:
        epoch += int(epochs.started > epochs.completed)  # the epoch is over: the next one starts fresh
        offset = 0
    return {**sampler.state_dict(), "epoch": epoch, "offset": offset}


class ExactResume(Callback):
    """Stores what a resumed fit needs beyond Lightning's state: global RNG states and the data position.

    The train sampler of the DataModule (``datamodule.train_sampler``, with ``state_dict`` /
    ``load_state_dict`` taking an ``offset``) gets its epoch and the number of samples already drawn
    from it, so the resumed epoch continues with the next unseen batch; the RNG states are put back
    right before the first resumed step. These are rank zero's; on several data-parallel ranks each rank's own
    stream is restored after them by :class:`experiments.parallel.streams.RankStreams` (every task has it).
    """

    KEY = "exact_resume"

    def __init__(self) -> None:
        self._pending_rng: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[self.KEY] = {"rng": rng_states(), "sampler": sampler_position(trainer)}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        state = checkpoint.get(self.KEY)
        if state is None:
            return
        self._pending_rng = state["rng"]
        sampler = getattr(trainer.datamodule, "train_sampler", None)
        if state.get("sampler") and hasattr(sampler, "load_state_dict"):
            sampler.load_state_dict(state["sampler"])  # before Lightning builds and iterates the train loader
            # Lightning only knows stateful DataLoaders and would warn that this resume replays the epoch.
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending_rng is not None:
            set_rng_states(self._pending_rng)  # after the loader's iterator drew its base seed, as in the original run
            self._pending_rng = None


#################################################################################
#                            A resumable stop on signals                         #
#################################################################################


def checkpoint_dir(trainer: L.Trainer) -> Path:
    """Where the run's checkpoints live: the first ModelCheckpoint's directory, else <log_dir>/checkpoints."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            return Path(callback.dirpath)
    return Path(trainer_run_dir(trainer)) / "checkpoints"


class InterruptCheckpoint(Callback):
    """On SIGTERM or a first Ctrl-C: stop at the next safe point, fit saves ``interrupted.ckpt``, exit non-zero.

    Lightning turns SIGTERM into a ``SIGTERMException`` after the running training step or evaluation
    batch; a first SIGINT is routed the same way (a second one interrupts at once). Lightning's predict
    loop never looks at the flag, so this callback does after every predict batch, and a long generation
    (the LM's ``predict``) reads :func:`stop_requested` between tokens. The fit checkpoint is written
    beside the run's other checkpoints, so ``--ckpt_path last`` picks it up. A hard interrupt in the
    middle of a step saves nothing: the last regular checkpoint is the resume point then.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous_sigint: Any = None
        self._trainer: L.Trainer | None = None

    def _route_sigint(self, trainer: L.Trainer) -> None:
        # After Lightning snapshots the signal handlers, so its teardown puts the original SIGINT handler
        # back on every exit path, exceptions included.
        if self._trainer is None and threading.current_thread() is threading.main_thread():
            self._trainer = trainer
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._route_sigint(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._route_sigint(trainer)  # (inside fit the handler is already in place)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._route_sigint(trainer)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._route_sigint(trainer)

    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.received_sigterm:
            raise SIGTERMException

    def _on_sigint(self, signum: int, frame: Any) -> None:
        trainer = self._trainer
        if trainer is None or self.signal_name is not None:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        self.signal_name = "SIGINT"
        # Lightning's own SIGTERM flag (it stops after the running step with a SIGTERMException): through the ranks'
        # vote on several processes, so every rank stops at the same step (experiments.reliability.signals)
        note_stop(trainer, signal.SIGINT)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        self._trainer = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException | KeyboardInterrupt):
            return
        name = self.signal_name or ("SIGTERM" if isinstance(exception, SIGTERMException) else "SIGINT")
        stage = trainer.state.fn.value if trainer.state.fn is not None else "run"  # fit / validate / test / predict
        if stage != "fit":
            exception.add_note(f"interrupted by {name} during {stage}; stopped after the current batch, no result")
            return
        progress = trainer.fit_loop.epoch_loop.batch_progress.current
        if progress.ready != progress.completed or trainer.global_step == 0:  # inside a step, or before the first
            exception.add_note(f"interrupted by {name} at step {trainer.global_step}; no checkpoint saved")
            return
        path = checkpoint_dir(trainer) / INTERRUPTED_NAME
        trainer.save_checkpoint(path, weights_only=False)
        exception.add_note(
            f"interrupted by {name} at step {trainer.global_step}; saved {path} (resume: the same command "
            "with --ckpt_path last)"
        )


def stop_requested(trainer: L.Trainer | None) -> bool:
    """True once SIGTERM or a first Ctrl-C asked the run to stop: long work inside one step checks it."""
    return trainer is not None and bool(trainer.received_sigterm)
