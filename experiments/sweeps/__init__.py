"""Running grids of runs: locally, as processes two at a time, or as SLURM jobs.

    spec.py       the sweep file: keys, validation, the grid of runs
    sweep.py      ``python -m experiments sweep``: run / submit, --status, --collect, --dry-run
    launchers.py  local processes (resumable, stoppable)         cluster.py  submitit jobs (SLURM arrays, local)
    jobs.py       what a cluster job runs (exact requeue)         status.py   where every run stands
    progress.py   a line per running run and the grid's ETA      estimate.py, plan.py  compute before running
    ownership.py  which directories a sweep may create or delete
    options.py    the sweep file's protocol / stages / last_evals options, checked before any run
    protocol.py   tune_then_compare: each scheme's best rate on tuning seeds, then fresh seeds at that rate
    compute_option.py, compute_runs.py  protocol.compute_multiples: the baseline's longer runs, each better
                  scheme's effective-compute multiplier with its interval over seeds
    stages.py     seeds in stages: only undecided cells continue, each look at its O'Brien-Fleming level
    measure.py    a run's metric as the mean of its last k validations, and that mean's own spread

Belongs here: starting, watching and resuming runs. When a grid finishes, :mod:`experiments.results` reads it.
Never imported by the tasks (runs are processes).
"""
