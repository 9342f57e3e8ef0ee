"""``python -m experiments.bench``: the benchmark's command line (:func:`experiments.bench.cli.main`)."""

from experiments.bench.cli import main

if __name__ == "__main__":
    main()
