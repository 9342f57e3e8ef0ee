"""``python -m experiments.bench``: the benchmark's command line (:func:`experiments.bench.cli.main`).

Bad input is one ``error:`` line and exit status 2, as through ``python -m experiments bench``.
"""

import sys

from experiments.bench.cli import main
from experiments.reliability.errors import UsageExit

if __name__ == "__main__":
    try:
        main()
    except UsageExit as err:  # Python would print its line and exit 1; the suite's status for bad input is 2
        print(err.code, file=sys.stderr)
        sys.exit(2)
