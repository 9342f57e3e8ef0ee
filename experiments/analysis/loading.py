"""Rebuild a trained run for analysis: its LightningModule and DataModule from the saved config, its weights
from the checkpoint, and a fixed set of validation batches every analysis of the run shares."""

from __future__ import annotations

import contextlib
import itertools
import logging
import tempfile
import warnings
from pathlib import Path

import lightning as L
import yaml
from lightning.fabric.utilities.apply_func import move_data_to_device

from experiments.reliability.config_files import read_config
from experiments.reliability.errors import SuiteError
from experiments.reliability.safe_load import load_checkpoint

# Keys a saved ``fit`` config carries that the run-less CLI does not take.
_SUBCOMMAND_KEYS = ("ckpt_path", "weights_only", "verbose", "return_predictions")


class AnalysisError(SuiteError):
    """A user-facing problem, reported as one line (exit status 2)."""


@contextlib.contextmanager
def _quiet(*loggers: str):
    """Raises the given loggers to WARNING for the duration."""
    saved = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def run_dir_of(ckpt: Path) -> Path:
    """``runs/<task>/<exp>/<run>`` for ``.../<run>/checkpoints/x.ckpt``, else the checkpoint's folder."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def load_module(
    ckpt: Path, configs: list[str], overrides: list[str], device: str, tasks: tuple[str, ...] = ("lm", "vit", "dit")
) -> tuple[L.LightningModule, L.LightningDataModule]:
    """Rebuilds the LightningModule and DataModule through the suite's CLI and loads the weights.

    Args:
        ckpt: the checkpoint.
        configs: configs to build from; empty: the run directory's saved ``config.yaml``.
        overrides: CLI overrides (``--model.init_args....=...``) applied on top.
        device: where the module goes.
        tasks: the tasks the caller can analyse; another task is an error before any weight is read.
    """
    from experiments.cli import SuiteCLI

    if not ckpt.exists():
        raise AnalysisError(f"checkpoint {str(ckpt)!r} does not exist")
    # weights_only: a file that would run code is refused before anything else; a sharded folder: consolidated
    payload = load_checkpoint(ckpt)
    with tempfile.TemporaryDirectory() as tmp:
        if not configs:
            saved = run_dir_of(ckpt) / "config.yaml"
            if not saved.is_file():
                raise AnalysisError(f"no config.yaml next to {ckpt.parent}; pass --config CONFIG [--config OVERLAY]")
            config = read_config(str(saved))  # the checked reader: a tab or a bad value is one line naming the file
            for key in _SUBCOMMAND_KEYS:
                config.pop(key, None)
            configs = [str(Path(tmp) / "config.yaml")]
            Path(configs[0]).write_text(yaml.safe_dump(config))
        args = [arg for cfg in configs for arg in ("-c", cfg)] + list(overrides) + ["--trainer.logger=false"]
        with warnings.catch_warnings(), _quiet("lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # we are the command line
            cli = SuiteCLI(args=args, run=False)  # builds a Trainer too: its accelerator banner is noise here
    task = getattr(cli.model, "task", type(cli.model).__name__)
    if task not in tasks:
        raise AnalysisError(f"{ckpt} is a {task!r} checkpoint; this tool takes {', '.join(tasks)} checkpoints")
    try:
        cli.model.load_state_dict(payload["state_dict"])
    except (RuntimeError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AnalysisError(f"checkpoint {ckpt} does not fit the rebuilt model: {first}") from None
    return cli.model.to(device).eval(), cli.datamodule


def validation_batches(datamodule: L.LightningDataModule, n: int, device: str) -> list:
    """The first ``n`` validation batches (the validation loader is not shuffled), on ``device``."""
    datamodule.prepare_data()
    datamodule.setup("validate")
    batches = [move_data_to_device(b, device) for b in itertools.islice(datamodule.val_dataloader(), n)]
    if not batches:
        raise AnalysisError("the validation set is empty")
    return batches
