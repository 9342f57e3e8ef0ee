"""A run's checkpoint as the exporters see it: which task, its settings, the network with the weights it is
evaluated with, and what the run recorded about itself.

    <run>/checkpoints/last.ckpt   torch.load(weights_only=True) through the suite's safe loader (memory-mapped:
                                  reading the settings costs nothing; the weights are read when a network
                                  is built); must hold a task's hyper_parameters (trunk included) and state_dict;
                                  a sharded checkpoint (a folder) is read through its consolidated file
    <run>/summary.json            test metrics and their protocol, final validation metrics (optional)
    <run>/config.yaml             trainer settings: steps, precision, seed (optional)

The evaluated weights: the EMA copy where the task evaluates it (DiT always, ViT with ``ema_decay``), else
the trained ones. Anything that is not a suite run's checkpoint is one line, before a network is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from experiments.monitoring.records import SUMMARY_FILE, read_json
from experiments.reliability.checkpointing import step_of
from experiments.reliability.config_files import read_config
from experiments.reliability.errors import CheckpointError, SuiteError
from experiments.reliability.layout import TASK_NAMES, run_dir_of_checkpoint
from experiments.reliability.safe_load import load_checkpoint
from experiments.reliability.summaries import check_summary
from models import DiT, LanguageModel, TrunkConfig, ViTClassifier

EXPORTABLE = {"lm": "a language model", "vit": "a ViT classifier", "dit": "a latent DiT"}
CONFIG_FILE = "config.yaml"


@dataclass
class RunCheckpoint:
    """What a suite checkpoint holds, read once and lazily.

    Attributes:
        path: the checkpoint file.
        task: "lm", "vit" or "dit".
        hparams: the task module's saved hyperparameters (``trunk`` as a dict).
        data_hparams: the DataModule's saved hyperparameters (``_class_path`` included).
        state: the Lightning state dict (``net.*``, ``ema.module.*``, metric states).
        step: optimizer steps trained.
        run_dir: the run directory when the checkpoint sits in one the suite made, else None.
        summary: the run's ``summary.json`` ({} when absent).
        config: the run's ``config.yaml`` ({} when absent).
    """

    path: Path
    task: str
    hparams: dict[str, Any]
    data_hparams: dict[str, Any]
    state: dict[str, Tensor]
    step: int
    run_dir: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def trunk(self) -> TrunkConfig:
        return TrunkConfig(**self.hparams["trunk"])

    @property
    def scheme(self) -> str:
        return str(self.hparams["trunk"]["norm_scheme"])

    @property
    def uses_ema(self) -> bool:
        """Whether the task evaluates (and so the export carries) the EMA weights."""
        return self.task == "dit" or (self.task == "vit" and bool(self.hparams.get("ema_decay")))

    def weights(self) -> dict[str, Tensor]:
        """The evaluated network's state dict (EMA copy where the task evaluates it)."""
        prefix = "ema.module." if self.uses_ema else "net."
        weights = {k.removeprefix(prefix): v for k, v in self.state.items() if k.startswith(prefix)}
        if not weights:
            raise CheckpointError(
                f"checkpoint {self.path} holds no {prefix}* weights; it is not a finished suite run's"
            )
        return weights

    def network(self) -> nn.Module:
        """The task's network (eval mode, CPU, float32) with the evaluated weights."""
        hp, trunk = self.hparams, self.trunk
        if self.task == "lm":
            tied = bool(hp.get("tie_embeddings", False))
            net = LanguageModel(trunk, int(hp["vocab_size"]), max_seq_len=int(hp["seq_len"]), tie_embeddings=tied)
        elif self.task == "vit":
            size, patch, classes = int(hp["img_size"]), int(hp["patch_size"]), int(hp["num_classes"])
            net = ViTClassifier(trunk, size, patch, 3, classes, float(hp.get("drop_rate", 0.0)))
        else:
            net = DiT(
                trunk,
                int(hp["latent_size"]),
                int(hp["patch_size"]),
                int(hp["latent_channels"]),
                int(hp["num_classes"]),
                float(hp["class_dropout_prob"]),
                bool(hp["learn_sigma"]),
            )
        try:
            net.load_state_dict(self.weights())
        except RuntimeError as err:
            # torch's first line is only "Error(s) in loading state_dict for X:"; the next one names a tensor
            lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
            first = lines[1] if len(lines) > 1 and lines[0].startswith("Error(s) in loading") else lines[0]
            raise CheckpointError(f"checkpoint {self.path} does not fit its own hyperparameters: {first}") from None
        return net.float().eval()


def read_run_checkpoint(path: str | Path) -> RunCheckpoint:
    """Reads a suite run's checkpoint (settings only; weights stay memory-mapped until used).

    Raises:
        CheckpointError: missing, unreadable or unsafe, not a run's checkpoint, or of a task that is not
            exported (the VAE: its run already writes diffusers' layout).
    """
    path = Path(path)
    payload = load_checkpoint(path, mmap=True)  # a sharded checkpoint (a folder): its one-file form, cached
    hparams = payload.get("hyper_parameters")
    class_path = str(hparams.get("_class_path", "")) if isinstance(hparams, dict) else ""
    task = TASK_NAMES.get(class_path.rsplit(".", 1)[-1])
    state = payload.get("state_dict")
    if task is None or not isinstance(hparams.get("trunk"), dict) or not isinstance(state, dict):
        found = f"a {class_path} model" if class_path else "no suite hyper_parameters (a task's _class_path and trunk)"
        raise CheckpointError(
            f"--ckpt {path} is not a suite run's checkpoint: it holds {found}; valid: a checkpoint written by "
            "`python -m experiments fit` of an LM, ViT or DiT run"
        )
    if task not in EXPORTABLE:
        raise SuiteError(
            f"--ckpt {path} is a {task} run; valid: an LM, ViT or DiT run (a VAE run already saves diffusers' "
            "AutoencoderKL layout with save_pretrained)"
        )
    run_dir = run_dir_of_checkpoint(path)
    summary = read_json(run_dir / SUMMARY_FILE) if run_dir is not None else {}
    if summary:  # what the card reads from it (test metrics, their protocol) has the types it expects, or one line
        check_summary(summary, run_dir / SUMMARY_FILE)
    return RunCheckpoint(
        path=path,
        task=task,
        hparams=dict(hparams),
        data_hparams=dict(payload.get("datamodule_hyper_parameters") or {}),
        state=state,
        step=step_of(payload, path) if "global_step" in payload else 0,
        run_dir=run_dir,
        summary=summary,
        config=_read_config(run_dir / CONFIG_FILE) if run_dir is not None else {},
    )


def _read_config(path: Path) -> dict[str, Any]:
    """The run's saved config (trainer settings), through the checked reader; {} when absent or unreadable (it
    only adds detail)."""
    try:
        return read_config(str(path)) if path.is_file() else {}
    except SuiteError:
        return {}
