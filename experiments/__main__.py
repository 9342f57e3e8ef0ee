"""Entry point: ``python -m experiments <fit|validate|test|predict|sweep> ...``."""

from __future__ import annotations

import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "sweep":
        from experiments.sweep import main as sweep_main

        sweep_main(argv[1:])
        return
    from experiments.cli import main as cli_main

    cli_main(argv)


if __name__ == "__main__":
    main()
