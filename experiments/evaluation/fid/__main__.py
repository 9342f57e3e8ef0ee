"""``python -m experiments.evaluation.fid`` (same as ``python -m experiments fid``)."""

import sys

from experiments.evaluation.fid.cli import main

if __name__ == "__main__":
    sys.exit(main())
