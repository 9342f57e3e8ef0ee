"""Entry point: ``python -m experiments <fit|validate|test|predict> ...`` (LightningCLI) and the tools
``sweep`` (grids of runs), ``prune`` (layer-pruning sensitivity) and ``logit-lens`` (per-stream readouts)."""

from __future__ import annotations

import importlib
import sys

TOOLS = {
    "sweep": "experiments.sweep",
    "prune": "experiments.analysis",
    "logit-lens": "experiments.analysis",
}


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in TOOLS:
        module = importlib.import_module(TOOLS[argv[0]])
        module.main(argv)
        return
    from experiments.cli import main as cli_main

    cli_main(argv)


if __name__ == "__main__":
    main()
