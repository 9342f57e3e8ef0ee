"""Grids of runs and their comparison: ``sweep.py`` launches one ``fit`` process per run (resumable,
stoppable), ``compare.py`` turns the runs' summaries into a table and plots, ``profiles.py`` draws depth
profiles from the diagnostics, ``tb_layout.py`` writes the TensorBoard custom-scalars layout.

Belongs here: anything that looks at several runs at once. Never imported by the tasks.
"""
