"""Metrics beyond the training loss, by the protocols papers report: FID (``fid/``: weights found offline,
the torchmetrics metric, reference statistics).

Belongs here: code that scores a model or its samples and is shared by a task's ``test`` and the
command line. Never imports the tasks: a task calls into evaluation, not the other way round.
"""
