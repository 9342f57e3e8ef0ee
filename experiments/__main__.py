"""Entry point: ``python -m experiments [--debug] <fit|validate|test|predict> ...`` (LightningCLI) and the tools
``sweep`` (grids of runs), ``prune`` (layer-pruning sensitivity) and ``logit-lens`` (per-stream readouts).

Bad input ends with one line ``error: <what is wrong and what would be valid>`` on stderr and exit
status 2; an interrupted fit (SIGTERM, Ctrl-C) says where its resumable checkpoint is and exits with
143 / 130. ``--debug`` (anywhere on the command line) adds the Python traceback. Anything else
unexpected is a bug and shows its traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback

TOOLS = {
    "sweep": "experiments.sweep",
    "prune": "experiments.analysis",
    "logit-lens": "experiments.analysis",
}
DEBUG_FLAG = "--debug"


def main(argv: list[str] | None = None) -> None:
    """Runs a subcommand; on a user error or interrupt prints one line and raises ``SystemExit(status)``."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv
    # Only this process's view: Lightning's DDP launcher re-runs sys.argv, flag included, for the other ranks.
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        if argv and argv[0] in TOOLS:
            importlib.import_module(TOOLS[argv[0]]).main(argv)
            return
        from experiments.cli import main as cli_main

        # LightningCLI warns when given args while sys.argv has some too: let it read sys.argv when they agree.
        cli_main(None if from_command_line and not debug else argv)
    except BaseException as exc:  # noqa: BLE001 - every exit goes through one place
        from experiments.errors import describe

        described = describe(exc)
        if described is None:
            raise  # SystemExit with its own status, or a bug: Python prints the traceback
        status, message = described
        if debug:
            traceback.print_exception(exc)
        print(f"error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(status) from None


if __name__ == "__main__":
    main()
