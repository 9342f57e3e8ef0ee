"""The downstream evaluator inside a Lightning run: at ``test`` (the LM task calls :func:`evaluate_at_test`)
and in-loop during ``fit`` (the :class:`DownstreamEval` callback, as OLMo evaluates every N steps).

Where the scores go:

    test     self.log("test/downstream/<task>/<metric>", "test/downstream/avg", ...)  -> TensorBoard and, by
             RunSummary, summary.json["test"]; summary.json["test_protocol"]["downstream"]; the HPARAMS tab
             gains test/downstream/avg and test/downstream/avg_bpb columns
    in-loop  "downstream/<task>/<metric>", "downstream/avg", "downstream/avg_bpb" at the training step, so
             the curves of the schemes of a sweep overlay in one TensorBoard view

Test results keep the ``test/`` prefix (like ``test/ppl``) rather than adding a point to the in-loop
``downstream/`` curves: a test of a checkpoint older than the last in-loop evaluation would write an
earlier step after a later one, and TensorBoard discards the later points as orphaned.

Under DDP every rank scores its share of the rows; ``ICLMetric`` gathers them (torchmetrics sync), so
every rank logs the same numbers. The forwards run in the trainer's precision context (autocast for
``bf16-mixed``), under ``torch.no_grad``, with the module in eval mode. FSDP is refused: the LM is called
directly, outside the sharded wrapper's forward.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from experiments.evaluation.downstream.config import DEFAULT_TASKS, SAMPLE_SEED, DownstreamConfig
from experiments.monitoring.hparams import declare_hparams
from experiments.reliability.checkpointing import stop_requested

HPARAMS_METRICS = ("test/downstream/avg", "test/downstream/avg_bpb")


def _evaluator(pl_module: L.LightningModule, config: DownstreamConfig):
    from experiments.evaluation.downstream.scorer import DownstreamEvaluator  # loads olmo_eval, datasets

    if isinstance(pl_module.trainer.strategy, FSDPStrategy):  # self.net's weights are shards outside FSDP's forward
        raise ValueError(
            "downstream evaluation does not run under FSDP (the LM's weights are sharded); valid: "
            "--trainer.strategy=ddp or one device, from a consolidated checkpoint"
        )
    datamodule = pl_module.trainer.datamodule
    tokenizer = getattr(datamodule, "tokenizer", None)
    net = getattr(pl_module, "net", None)
    if tokenizer is None or not hasattr(net, "max_seq_len"):
        raise ValueError(
            f"downstream evaluation needs a language model and its tokenizer; got {type(pl_module).__name__} "
            f"with {type(datamodule).__name__}; valid: experiments.tasks.LanguageModeling on a TextDataModule"
        )
    return DownstreamEvaluator(config, tokenizer, net.max_seq_len)


def _score(evaluator, pl_module: L.LightningModule, progress: bool):
    trainer = pl_module.trainer
    was_training = pl_module.training
    pl_module.eval()
    try:
        return evaluator.evaluate(
            pl_module.net,
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            device=pl_module.device,
            forward_context=trainer.precision_plugin.forward_context,
            progress=progress and trainer.is_global_zero,
            should_stop=lambda: stop_requested(trainer),
        )
    except InterruptedError as err:  # SIGTERM / Ctrl-C between batches: stop as Lightning does, say what is lost
        stop = SIGTERMException()
        stop.add_note(f"{err}; downstream scores are not saved part-way: rerun the command to score again")
        raise stop from None
    finally:
        pl_module.train(was_training)


def evaluate_at_test(pl_module: L.LightningModule, config: DownstreamConfig) -> dict[str, float]:
    """Scores the module's LM on the configured tasks at the end of ``test`` and records the results.

    Returns:
        The logged ``test/downstream/...`` metrics.
    """
    trainer = pl_module.trainer
    evaluator = _evaluator(pl_module, config)
    results = _score(evaluator, pl_module, progress=True)
    metrics = results.metrics("test/downstream")
    for name, value in metrics.items():
        pl_module.log(name, value)  # identical on every rank (already gathered): no sync_dist
    protocol = evaluator.protocol(precision=str(trainer.precision), world_size=trainer.world_size)
    pl_module.test_protocol = {**(getattr(pl_module, "test_protocol", None) or {}), "downstream": protocol}
    if trainer.is_global_zero:
        print(f"downstream ({results.rows} rows in {results.seconds:.0f} s):\n{results.to_markdown()}", flush=True)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                declare_hparams(logger, _hparams_columns(pl_module), [*_hparams_metrics(pl_module), *HPARAMS_METRICS])
    return metrics


def _hparams_columns(pl_module: L.LightningModule) -> dict[str, Any]:
    """The task's own short HPARAMS columns (the suite's tasks name them), else all of its hparams."""
    columns = getattr(pl_module, "shown_hparams_columns", None)
    return columns() if callable(columns) else dict(pl_module.hparams)


def _hparams_metrics(pl_module: L.LightningModule) -> list[str]:
    metrics = getattr(pl_module, "hparams_metrics", None)
    return list(metrics()) if callable(metrics) else [getattr(pl_module, "key_metric", "val/loss")]


class DownstreamEval(Callback):
    """OLMo-style in-loop downstream evaluation every ``every_n_steps`` optimizer steps.

    Logs ``downstream/<task>/<metric>``, ``downstream/avg`` and ``downstream/avg_bpb`` at the training step.
    The tasks are built once (the first evaluation), the question sample is fixed, so the points of a
    curve, and the curves of different runs, score the same questions.

    Args:
        every_n_steps: evaluate after every this many optimizer steps.
        tasks: ``olmo_eval`` task labels; None: the default in-loop set.
        limit: questions per task (a seeded sample); None scores all.
        batch_size: rows per forward pass.
        seed: seed of the question sample.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        tasks: list[str] | None = None,
        limit: int | None = 100,
        batch_size: int = 32,
        seed: int = SAMPLE_SEED,
    ) -> None:
        if every_n_steps <= 0:
            raise ValueError(f"every_n_steps={every_n_steps} must be a positive number of steps")
        self.every_n_steps = every_n_steps
        self.config = DownstreamConfig(list(tasks or DEFAULT_TASKS), limit, batch_size, seed)
        self._evaluator = None
        self._last_step = -1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # global_step repeats over the micro-batches of an accumulated step: evaluate once per step
        if step == 0 or step % self.every_n_steps or step == self._last_step:
            return
        self._last_step = step
        if self._evaluator is None:
            self._evaluator = _evaluator(pl_module, self.config)
        results = _score(self._evaluator, pl_module, progress=False)
        metrics = results.metrics("downstream")
        for logger in trainer.loggers:  # rank-zero only inside Lightning's loggers
            logger.log_metrics(metrics, step=step)
        avg = results.averages()
        rank_zero_info(
            f"downstream @ step {step}: avg {100 * avg.get('avg', float('nan')):.2f} %, "
            f"avg_bpb {avg.get('avg_bpb', float('nan')):.4f} ({results.rows} rows, {results.seconds:.0f} s)"
        )
