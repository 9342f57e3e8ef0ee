"""A run's row in TensorBoard's HPARAMS tab: its hyperparameter columns and which metrics are columns.

TensorBoard reads each metric column's value from the run's own scalars of that tag, so declaring a column
needs no value. Lightning's ``log_hyperparams(params, metrics)`` also logs every metric at the current step,
which puts a placeholder (NaN or 0) into the metric's chart at step 0; ``declare_hparams`` writes only the
hparams summaries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, is_dataclass
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only


@rank_zero_only
def declare_hparams(logger: TensorBoardLogger, params: dict[str, Any], metrics: Iterable[str]) -> None:
    """Writes the HPARAMS row of ``logger``'s run: ``params`` (flattened) as columns, ``metrics`` as metric columns."""
    from torch.utils.tensorboard.summary import hparams

    flat = flat_params(params)
    logger.hparams.update(flat)  # hparams.yaml, as Lightning's log_hyperparams keeps it
    writer = logger.experiment._get_file_writer()  # what Lightning's log_hyperparams writes through
    for summary in hparams(flat, dict.fromkeys(metrics, 0.0)):
        writer.add_summary(summary)
    writer.flush()


def flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"trunk/dim": 128, ...}``: nested dicts and dataclasses flattened, other values as TensorBoard takes them."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        if isinstance(value, dict):
            flat.update(flat_params(value, f"{prefix}{key}/"))
        elif isinstance(value, bool | int | float | str):
            flat[f"{prefix}{key}"] = value
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat
