"""What a run shows a newcomer first: its TensorBoard tags, model summary, progress label and checkpoint notes.

Real Lightning trainers on a 32 -> 2 linear model (milliseconds), then one real ``fit`` of the tiny LM through
the suite's CLI for the tags TensorBoard's TIME SERIES tab shows first.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.monitoring.first_validation import FirstValidationNote
from experiments.monitoring.model_summary import SuiteModelSummary, SuiteRichModelSummary
from experiments.monitoring.progress_bar import SuiteRichProgressBar
from experiments.monitoring.tensorboard import EPOCH_TAG, SuiteTensorBoardLogger, epochs_are_the_budget


class Logged(BoringModel):
    """BoringModel that logs a training loss every step and ``val/<name>`` at each validation."""

    def __init__(self, monitor: str = "val/acc1") -> None:
        super().__init__()
        self.monitor = monitor

    def training_step(self, batch, batch_idx):
        loss = self.step(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log(self.monitor, self.step(batch))


def trainer(tmp_path: Path, **kwargs) -> L.Trainer:
    defaults = dict(default_root_dir=tmp_path, accelerator="cpu", logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=1)  # fmt: skip
    return L.Trainer(**{**defaults, **kwargs})


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


########################################################################## the epoch scalar


@pytest.mark.parametrize(
    ("trainer_config", "expected"),
    [
        ({"max_steps": 120}, False),  # the demo: steps are the budget
        ({"max_steps": 120, "max_epochs": -1}, False),
        ({"max_epochs": 5}, True),  # configs/vit/tiny.yaml
        ({"max_epochs": 5, "max_steps": 3}, True),  # cut short, still an epoch run
        ({}, True),  # Lightning's default: 1000 epochs
        ({"max_time": "00:01:00:00"}, False),
    ],
)
def test_which_runs_count_epochs(trainer_config: dict, expected: bool):
    assert epochs_are_the_budget(trainer_config) is expected


def test_a_step_run_logs_no_epoch_and_an_epoch_run_logs_it_with_the_training_curves(tmp_path: Path):
    steps = SuiteTensorBoardLogger(tmp_path, name="", version="steps", log_epoch=False)
    trainer(tmp_path, max_steps=3, logger=steps, limit_val_batches=0).fit(Logged())
    logged = scalars(tmp_path / "steps")
    assert set(logged) == {"train/loss"}  # no "epoch" at all
    epochs = SuiteTensorBoardLogger(tmp_path, name="", version="epochs", log_epoch=True)
    trainer(tmp_path, max_epochs=2, limit_train_batches=2, logger=epochs, limit_val_batches=0).fit(Logged())
    logged = scalars(tmp_path / "epochs")
    assert "epoch" not in logged
    assert logged[EPOCH_TAG] == [(0, 0.0), (1, 0.0), (2, 1.0), (3, 1.0)]  # 2 batches per epoch, logged per step


########################################################################## the model summary


def test_the_summary_shows_flops_only_when_counted(tmp_path: Path, capsys, caplog):
    model = Logged()
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.callbacks.model_summary"):
        trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[SuiteModelSummary()]).fit(model)
    assert "Total params" in caplog.text and "FLOPs" not in caplog.text and "Flops" not in caplog.text
    trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[SuiteRichModelSummary()]).fit(model)
    shown = capsys.readouterr().out
    assert "Total params" in shown and "FLOPs" not in shown
    model.example_input_array = torch.zeros(4, 32)  # now Lightning counts: 4 rows x 32 x 2 multiply-adds x 2
    trainer(tmp_path, max_steps=1, limit_val_batches=0, callbacks=[SuiteRichModelSummary()]).fit(model)
    assert "Total FLOPs: 512" in capsys.readouterr().out


########################################################################## the progress bar


class Labels(L.Callback):
    """Records the rich bar's training label after each batch."""

    def __init__(self, bar: SuiteRichProgressBar) -> None:
        self.bar, self.seen = bar, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append(self.bar.progress.tasks[self.bar.train_progress_bar_id].description.strip())


def test_a_step_run_is_labelled_with_its_step_budget_not_epoch_minus_two(tmp_path: Path):
    bar = SuiteRichProgressBar()
    labels = Labels(bar)
    trainer(tmp_path, max_steps=5, limit_val_batches=0, limit_train_batches=3, enable_progress_bar=True,
            callbacks=[bar, labels]).fit(Logged())  # fmt: skip
    # the label is written before Lightning redraws, so a batch's own step shows with it
    assert labels.seen == [f"Epoch {e}, step {s}/5" for e, s in [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5)]]
    bar = SuiteRichProgressBar()
    labels = Labels(bar)
    trainer(tmp_path, max_epochs=2, limit_val_batches=0, limit_train_batches=2, enable_progress_bar=True,
            callbacks=[bar, labels]).fit(Logged())  # fmt: skip
    assert labels.seen == ["Epoch 0/1", "Epoch 0/1", "Epoch 1/1", "Epoch 1/1"]  # epochs bound it: Lightning's label


########################################################################## a fit stopped before validating


def fit_and_catch(tmp_path: Path, caplog, monitor: str, **kwargs) -> list[str]:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor=monitor, save_last=True)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        trainer(tmp_path, enable_checkpointing=True, num_sanity_val_steps=0,
                callbacks=[FirstValidationNote(), checkpoint], **kwargs).fit(Logged(monitor))  # fmt: skip
    return [str(w.message) for w in caught]


def test_a_run_stopped_inside_its_first_epoch_says_so_instead_of_the_logging_hint(tmp_path: Path, caplog):
    # an epoch run (validation at each epoch end) cut by max_steps before the first epoch ends
    caught = fit_and_catch(tmp_path, caplog, "val/acc1", max_epochs=5, max_steps=3, limit_train_batches=10)
    assert not [m for m in caught if "could not find the monitored key" in m]
    note = "the fit stopped at step 3 before validating: no checkpoint is ranked by val/acc1 (last.ckpt holds"
    assert note in caplog.text
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()


def test_the_hint_stays_where_no_validation_can_ever_log_the_metric(tmp_path: Path, caplog):
    caught = fit_and_catch(tmp_path, caplog, "val/acc5", max_epochs=5, max_steps=3, limit_train_batches=10,
                           limit_val_batches=0)  # fmt: skip
    assert [m for m in caught if "`ModelCheckpoint(monitor='val/acc5')` could not find the monitored key" in m]
    assert "before validating" not in caplog.text


def test_a_run_that_validated_says_nothing(tmp_path: Path, caplog):
    caught = fit_and_catch(tmp_path, caplog, "val/top1", max_epochs=1, limit_train_batches=3)
    assert not [m for m in caught if "could not find the monitored key" in m]
    assert "before validating" not in caplog.text
