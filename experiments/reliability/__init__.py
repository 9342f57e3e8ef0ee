"""What makes a run trustworthy: one-line user errors, checkpoints that are atomic, checked and resumable
exactly, and the run-directory layout.

Belongs here: anything that decides whether a file a user hands in is read, where a run may write, and how
a failure is reported. Not here: what a run records about its training (``experiments.monitoring``).
"""
