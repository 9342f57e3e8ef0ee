"""One LightningCLI parser per CLI class in a test process, instead of one per command.

Building the suite's parser (four subcommands, every Trainer / model / data signature) costs about as much
as parsing and saving a config together, and every ``SuiteCLI`` of a test process builds the very same
parser: it depends on the CLI class and its constructor arguments, never on the command line. The tests
run hundreds of commands in process, so :func:`built_once` keeps the first parser of each kind and hands it
to later CLIs. Parsing, linking, checking and instantiating still run for every command, as in a fresh
process; only the construction is shared (each test process still builds every parser once, and the
``python -m experiments`` tests build theirs from nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.cli import LightningCLI


def _key(cli: LightningCLI, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> tuple:
    """Everything :meth:`LightningCLI.setup_parser` reads (trainer callbacks go to the Trainer, not the parser)."""
    defaults = {k: v for k, v in cli.trainer_defaults.items() if k != "callbacks"}
    return (
        type(cli), add_subcommands, repr(main_kwargs), repr(subparser_kwargs), repr(defaults),
        cli._model_class, cli._datamodule_class, cli.subclass_mode_model, cli.subclass_mode_data,
        cli.auto_configure_optimizers, repr(cli.seed_everything_default), cli.trainer_class,
    )  # fmt: skip


def _reset(parsers: list[Any]) -> None:
    """Drops what a previous command left on a parser: a ``--print_config`` request whose parse failed before it
    printed, and the previous CLI's instantiators (each CLI adds its own after parsing)."""
    for parser in parsers:
        if hasattr(parser, "print_config"):
            del parser.print_config
        parser._instantiators = None


@contextmanager
def built_once() -> Iterator[None]:
    """Within the block, every LightningCLI reuses the parser an earlier CLI of the same kind built."""
    original = LightningCLI.setup_parser
    built: dict[tuple, tuple] = {}

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        key = _key(self, add_subcommands, main_kwargs, subparser_kwargs)
        if key not in built:
            original(self, add_subcommands, main_kwargs, subparser_kwargs)
            built[key] = (self.parser, getattr(self, "_subcommand_parsers", None),
                          getattr(self, "_subcommand_method_arguments", None))  # fmt: skip
            return
        parser, subparsers, method_arguments = built[key]
        _reset([parser, *(subparsers or {}).values()])
        self.parser = parser
        if add_subcommands:
            self._subcommand_parsers, self._subcommand_method_arguments = subparsers, method_arguments

    LightningCLI.setup_parser = setup_parser
    try:
        yield
    finally:
        LightningCLI.setup_parser = original
