"""The model summary every fit prints: Lightning's table, without a FLOPs count nobody measured.

Lightning counts FLOPs only while it runs the module's ``example_input_array`` through it; a task without
one gets a FLOPs column of zeros and ``Total FLOPs: 0``, which reads as a measurement. Here the column and
the total appear only when something was counted; everything else is Lightning's summary unchanged.
"""

from __future__ import annotations

import logging

from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import (
    _format_summary_table,
    get_formatted_model_size,
    get_human_readable_count,
)

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # where Lightning's handler prints it
FLOPS = "FLOPs"
_RIGHT = ("Params", "Params per Device", FLOPS, "In sizes", "Out sizes")  # numeric columns: right-aligned


def _counted(summary_data: list[tuple[str, list[str]]], total_flops: int) -> list[tuple[str, list[str]]]:
    """The summary's columns, without FLOPs when none were counted (no ``example_input_array``)."""
    return summary_data if total_flops else [column for column in summary_data if column[0] != FLOPS]


class SuiteModelSummary(ModelSummary):
    """Lightning's plain-text model summary; the FLOPs column and total only when FLOPs were counted."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs) -> None:  # fmt: skip
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops,
            *_counted(summary_data, total_flops),
        )  # fmt: skip
        if not total_flops:
            table = table.rsplit("\n", 1)[0]  # its last line is "0  Total Flops"
        log.info("\n" + table)


class SuiteRichModelSummary(RichModelSummary):
    """Lightning's rich model summary; the FLOPs column and total only when FLOPs were counted."""

    @staticmethod
    def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **summarize_kwargs) -> None:  # fmt: skip
        from rich import get_console
        from rich.table import Table

        columns = _counted(summary_data, total_flops)
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(name, justify="right" if name in _RIGHT else "left", style="dim" if name == " " else None)
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        lines = [
            ("Trainable params", get_human_readable_count(int(trainable_parameters))),
            ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
            ("Total params", get_human_readable_count(int(total_parameters))),
            ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
            ("Modules in train mode", str(total_training_modes["train"])),
            ("Modules in eval mode", str(total_training_modes["eval"])),
        ]
        if total_flops:
            lines.append(("Total FLOPs", get_human_readable_count(total_flops)))
        grid = Table.grid(expand=True)
        grid.add_column()
        for name, value in lines:
            grid.add_row(f"[bold]{name}[/]: {value}")
        console = get_console()
        console.print(table)
        console.print(grid)


def model_summary() -> ModelSummary:
    """The summary callback Lightning would add (rich when rich is installed), without unmeasured FLOPs."""
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    return SuiteRichModelSummary() if _RICH_AVAILABLE else SuiteModelSummary()


def has_model_summary(trainer_config) -> bool:
    """Whether the trainer config lists a model summary callback of its own (then it is left alone)."""
    callbacks = trainer_config.get("callbacks") or []
    return any(isinstance(c, ModelSummary) for c in (callbacks if isinstance(callbacks, list) else [callbacks]))
