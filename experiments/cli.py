"""``python -m experiments fit|validate|test|predict -c CONFIG [-c OVERLAY ...]``: the suite's LightningCLI.

Every run is written to ``<runs_root>/<task>/<experiment>/<run_name>/`` (TensorBoard events, the
resolved ``config.yaml``, checkpoints, ``summary.json``), so runs of one experiment under different
norm schemes overlay in one TensorBoard view: ``tensorboard --logdir runs/lm/tiny``.

Every run also gets (see :mod:`experiments.reliability.checkpointing`): atomic checkpoint writes, a resumable
``checkpoints/interrupted.ckpt`` on SIGTERM / Ctrl-C, exact resume (RNG states, data position) and a
checked ``--ckpt_path`` ("last" = the newest readable checkpoint of the run; a truncated file falls
back to the previous good one; a checkpoint of another shape or scheme is refused in one line).
The run directory is checked for writability before anything is built.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from experiments.monitoring.divergence import DivergenceDetector
from experiments.monitoring.summary import RunSummary
from experiments.reliability.checkpointing import (
    AtomicCheckpointIO,
    ExactResume,
    InterruptCheckpoint,
    check_checkpoint_fits,
    checkpoint_dir,
    resolve_checkpoint,
)
from experiments.reliability.errors import OutputDirError


class SuiteCLI(LightningCLI):
    """LightningCLI with subclass mode for model and data, data-derived links, run naming and safe checkpoints."""

    def __init__(self, *args, **kwargs) -> None:
        self._run_dir: Path | None = None  # set while parsing, checked before the trainer is built
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        # Parse errors raise (and become one line in __main__) instead of printing usage and exiting.
        parser_kwargs = {"exit_on_error": False, **({"parser_mode": "omegaconf"} if _has_omegaconf() else {})}
        kwargs["parser_kwargs"] = {**parser_kwargs, **(kwargs.get("parser_kwargs") or {})}
        # Persistent callbacks: added to whatever callbacks the config lists.
        defaults = dict(kwargs.get("trainer_defaults") or {})
        given = defaults.get("callbacks") or []
        defaults["callbacks"] = [*(given if isinstance(given, list) else [given]), ExactResume(), InterruptCheckpoint()]
        kwargs["trainer_defaults"] = defaults
        super().__init__(L.LightningModule, L.LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--runs_root", type=str, default="runs", help="where run directories are made")
        parser.add_argument("--experiment", type=str | None, default=None, help="defaults to the first config's name")
        parser.add_argument("--run_name", type=str | None, default=None, help="defaults to the norm scheme")
        # Callbacks every run gets, configurable as --summary.* / --divergence.*
        parser.add_lightning_class_args(RunSummary, "summary")
        parser.add_lightning_class_args(DivergenceDetector, "divergence")
        # Values only the data knows, linked into every task that takes them.
        for source, target in [
            ("data.vocab_size", "model.init_args.vocab_size"),
            ("data.seq_len", "model.init_args.seq_len"),
            ("data.num_classes", "model.init_args.num_classes"),
            ("data.image_size", "model.init_args.img_size"),
            ("data.latent_size", "model.init_args.latent_size"),
            ("data.latent_channels", "model.init_args.latent_channels"),
            ("data.vae_path", "model.init_args.vae_path"),
        ]:
            parser.link_arguments(source, target, apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        """Names the run directory ``runs/<task>/<experiment>/<run_name>`` and points the default
        TensorBoard logger and ``default_root_dir`` (checkpoints when no logger runs) at it."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        trunk = config.model.init_args.get("trunk")
        scheme = trunk.norm_scheme if trunk is not None else "model"
        task = _task_name(config.model.class_path)
        experiment = config.experiment or _experiment_from(config)
        version = config.run_name or scheme
        self._run_dir = Path(config.runs_root) / task / experiment / version
        if config.trainer.get("default_root_dir") is None:
            config.trainer.default_root_dir = str(self._run_dir)
        if config.trainer.get("logger") not in (None, True):
            return  # the user configured loggers explicitly
        config.trainer.logger = {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {
                "save_dir": config.runs_root,
                "name": f"{task}/{experiment}",
                "version": version,
                "default_hp_metric": False,
            },
        }

    def instantiate_trainer(self, **kwargs):
        """The trainer, in a writable run directory, with atomic checkpoint writes unless plugins are configured."""
        if self._run_dir is not None:
            ensure_writable(self._run_dir)  # before anything is written or trained
        config = self._get(self.config_init, "trainer", default={})
        if config.get("plugins") is None and "plugins" not in kwargs:
            kwargs["plugins"] = [AtomicCheckpointIO()]
        return super().instantiate_trainer(**kwargs)

    def _parse_ckpt_path(self) -> None:
        """Keeps the model config as given. LightningCLI would replace it with the hyperparameters saved in
        ``--ckpt_path`` (and crash on a truncated file); the suite checks the checkpoint against the config
        instead (:meth:`_check_ckpt_path`), so a saved config.yaml still says what ran."""

    def _check_ckpt_path(self) -> None:
        """Resolves ``--ckpt_path`` (last / fallback past a corrupt file) and refuses a checkpoint that does not fit."""
        config = self.config_init[self.subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path is None:
            return
        resolved = resolve_checkpoint(str(ckpt_path), checkpoint_dir(self.trainer))
        config["ckpt_path"] = resolved
        if resolved is not None and Path(resolved).is_file():
            check_checkpoint_fits(self.model, resolved, weights_only=config.get("weights_only"))

    before_fit = before_validate = before_test = before_predict = _check_ckpt_path


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


def _has_omegaconf() -> bool:
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        return False
    return True


def _task_name(class_path: str) -> str:
    from experiments.reliability.layout import TASK_NAMES

    return TASK_NAMES.get(class_path.rsplit(".", 1)[-1], class_path.rsplit(".", 1)[-1].lower())


def _experiment_from(config) -> str:
    paths = config.get("config") or []
    return Path(str(paths[0])).stem if paths else "default"


def main(args: list[str] | None = None) -> None:
    SuiteCLI(args=args, save_config_callback=SaveConfigCallback)
