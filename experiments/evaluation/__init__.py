"""Metrics beyond the training loss, by the protocols papers report: generation metrics (``generation.py``:
FID, KID, precision / recall, IS from one feature pass) and ``fid/`` (InceptionV3 weights found offline and
read safely, reference layouts, statistics files, the ``fid`` command).

Belongs here: code that scores a model or its samples and is shared by a task's ``test`` and the
command line. Never imports the tasks: a task calls into evaluation, not the other way round.
"""
