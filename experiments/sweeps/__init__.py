"""Grids of runs and their comparison.

    spec.py       the sweep file: keys, validation, the grid of runs
    sweep.py      ``python -m experiments sweep``: run / submit, --status, --collect, --dry-run
    launchers.py  local processes (resumable, stoppable)         cluster.py  submitit jobs (SLURM arrays, local)
    jobs.py       what a cluster job runs (exact requeue)         status.py   where every run stands
    progress.py   a line per running run and the grid's ETA      estimate.py, plan.py  compute before running
    ownership.py  which directories a sweep may create or delete
    compare.py    ``python -m experiments compare``: runs -> cells (cells.py) -> seed statistics and paired
                  tests (stats.py) -> tables (tables.py) and plots (plots.py, profiles.py; palette.py colours)
    tb_layout.py  the TensorBoard custom-scalars layout of a sweep
    export.py     a comparison copied into the repository; readme.py regenerates README's result blocks

Belongs here: anything that looks at several runs at once. Never imported by the tasks.
"""
