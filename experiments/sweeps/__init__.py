"""Grids of runs and their comparison.

- ``sweep.py`` launches one ``fit`` process per run (resumable, stoppable) and records the grid;
- ``compare.py`` turns the runs' summaries into the comparison (``python -m experiments compare``): it groups
  runs into cells (``cells.py``), computes seed statistics and paired tests (``stats.py``), prints the
  tables (``tables.py``) and draws the plots (``plots.py``, ``profiles.py`` for the depth profiles) in one
  colour per scheme (``palette.py``), and writes the TensorBoard custom-scalars layout (``tb_layout.py``);
- ``export.py`` copies a comparison into the repository and ``readme.py`` regenerates README's result
  blocks from those copies (``python -m experiments readme``).

Belongs here: anything that looks at several runs at once. Never imported by the tasks.
"""
