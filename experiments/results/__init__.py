"""Reading runs: a sweep directory's summaries turned into comparisons a reader can trust.

    runs.py        what a sweep directory holds: its spec (``sweep.yaml``) and each run's ``summary.json``
    compare.py     ``python -m experiments compare``: runs -> cells (cells.py) -> seed statistics, paired
                   tests and their power (stats.py) -> tables (tables.py) and plots (plots.py, profiles.py;
                   palette.py colours)
    speed.py       the speed table: throughput, peak memory, measured MFU, GPU-hours, the ratio to the baseline
    formatting.py  how the tables write numbers, estimates and p-values
    blockmodel.py, equivalence.py, verdicts.py, sequential.py   the verdicts: the block model and Dunnett, TOST,
                   better / worse / equivalent / undecided per cell, staged looks (simulate.py: null sweeps)
    measurement.py, reading.py   a run's metric as the mean of its last evaluations, and which value a table reads
    compute.py     learning-rate sensitivity and the effective-compute multiplier (pure functions)
    tb_layout.py   the TensorBoard custom-scalars layout of a sweep
    export.py      a comparison copied into the repository; readme.py regenerates the result blocks of
                   README.md and docs/*.md
    paper.py       README's table of the paper's claims next to this suite's measurements (docs/results/paper.yaml)

Belongs here: anything that reads several runs at once and never starts one. Running grids is
:mod:`experiments.sweeps`.
"""
