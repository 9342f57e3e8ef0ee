"""``python -m experiments fit|validate|test|predict -c CONFIG [-c OVERLAY ...]``: the suite's LightningCLI.

Every run is written to ``<runs_root>/<task>/<experiment>/<run_name>/`` (TensorBoard events, the
resolved ``config.yaml``, checkpoints, ``summary.json``), so runs of one experiment under different
norm schemes overlay in one TensorBoard view: ``tensorboard --logdir runs/lm/tiny``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from experiments.callbacks import DivergenceDetector, RunSummary


class SuiteCLI(LightningCLI):
    """LightningCLI with subclass mode for model and data, data-derived links and run naming."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {"parser_mode": "omegaconf"} if _has_omegaconf() else {})
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
        """Points the default TensorBoard logger at ``runs/<task>/<experiment>/<run_name>``."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.trainer.get("logger") not in (None, True):
            return  # the user configured loggers explicitly
        trunk = config.model.init_args.get("trunk")
        scheme = trunk.norm_scheme if trunk is not None else "model"
        task = _task_name(config.model.class_path)
        experiment = config.experiment or _experiment_from(config)
        config.trainer.logger = {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {
                "save_dir": config.runs_root,
                "name": f"{task}/{experiment}",
                "version": config.run_name or scheme,
                "default_hp_metric": False,
            },
        }

def _has_omegaconf() -> bool:
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        return False
    return True


def _task_name(class_path: str) -> str:
    from experiments.registry import TASK_NAMES

    return TASK_NAMES.get(class_path.rsplit(".", 1)[-1], class_path.rsplit(".", 1)[-1].lower())


def _experiment_from(config) -> str:
    paths = config.get("config") or []
    return Path(str(paths[0])).stem if paths else "default"


def main(args: list[str] | None = None) -> None:
    SuiteCLI(args=args, save_config_callback=SaveConfigCallback)
