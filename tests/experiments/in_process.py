"""A sweep's runs in the test's own process: what ``python -m experiments ARGS`` would run, without starting
Python again (each new process spends seconds importing torch and Lightning).

For tests of what a sweep decides (skip, resume, rerun) once real runs have proven the process side; the
process boundary itself (signals, exit statuses, parallel runs) is tested with real child processes.
"""

from __future__ import annotations

from experiments.__main__ import main
from experiments.sweeps.launchers import Children


def call_in_process(self: Children, argv: list[str], **kwargs) -> int | None:
    """Stands in for :meth:`Children.call`: runs the command's arguments through the suite's entry point and
    returns the exit status the process would have had (None once the sweep is stopping, as the real one)."""
    if self.stopping.is_set():
        return None
    assert argv[1:3] == ["-m", "experiments"], argv  # python -m experiments <subcommand> ...
    try:
        main(argv[3:])
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    return 0
