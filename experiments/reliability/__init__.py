"""What makes a run trustworthy: files read without running code, configs checked before anything is built,
run directories that stay where they belong, checkpoints that are atomic, checked and resumable exactly,
and failures reported in one line.

    safe_load.py       checkpoints, weights, arrays: weights_only=True / allow_pickle=False, one-line refusals
    config_files.py    -c files (YAML, empty, two tasks), bounded values with their origin, "did you mean"
    layout.py          <root>/<task>/<experiment>/<run_name>, checked names, the run marker, --overwrite
    checkpointing.py   atomic writes, --ckpt_path semantics, exact resume, SIGTERM / Ctrl-C
    signals.py         a stop signal on many ranks: the ranks' vote at each step, a deadline when they cannot meet
    sharded.py         sharded checkpoint folders: atomic saves with a manifest, read as untrusted input
    summaries.py       a run's summary.json read back: every field a reader uses has its type, or one line
    errors.py          SuiteError and the one line every exception becomes (exit status 2, 130, 143)

Belongs here: anything that decides whether a file a user hands in is read, where a run may write, and how
a failure is reported. Not here: what a run records about its training (``experiments.monitoring``).
"""
