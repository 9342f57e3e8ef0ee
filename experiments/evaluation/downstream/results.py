"""Scores of a downstream evaluation: per task, the average, as metric names and as a markdown table.

Per task the evaluator reports OLMo's primary metric (``acc``, or ``len_norm``: accuracy when each
choice's log-likelihood is divided by its length in characters) and, of the gold continuation,
``ce_loss`` (nats per character) and ``bpb`` (bits per UTF-8 byte). ``olmo_eval`` computes each in two
conventions; the suite reports ``_v2``, the OLMES one (lengths count the leading space of an answer);
for the accuracies both are equal in ``ai2-olmo-eval`` 0.9.0.

``avg`` is the unweighted mean of the primary metrics of the tasks scored by an accuracy (each MMLU
category counts as one task), ``avg_bpb`` the mean ``bpb`` over the tasks that report one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from experiments.evaluation.downstream.config import ACCURACY_METRICS

REPORTED = ("ce_loss", "bpb")  # besides the primary metric, when the task's metric computes them


@dataclass
class TaskResult:
    """One task's scores.

    Attributes:
        name: the ``olmo_eval`` label.
        metric: the primary metric type ("acc", "len_norm", ...).
        scores: metric name -> value (the primary one first).
        docs: questions scored (over all ranks).
        rows: (context, choice) rows scored (over all ranks).
        seconds: wall time of this process on the task (forward passes and metric updates).
    """

    name: str
    metric: str
    scores: dict[str, float]
    docs: int
    rows: int
    seconds: float

    @property
    def primary(self) -> float:
        return self.scores[self.metric]


def task_scores(metric: str, computed: dict) -> dict[str, float]:
    """The reported scores from ``ICLMetric.compute()``'s output (``<name>_v1`` / ``<name>_v2`` tensors)."""
    scores = {metric: float(computed[f"{metric}_v2"])}
    for name in REPORTED:
        if name != metric and f"{name}_v2" in computed:
            scores[name] = float(computed[f"{name}_v2"])
    return scores


@dataclass
class DownstreamResults:
    """Every task's result, in the configured order."""

    tasks: list[TaskResult] = field(default_factory=list)

    def averages(self) -> dict[str, float]:
        """``avg`` over the accuracy-scored tasks and ``avg_bpb`` over the tasks with a bpb."""
        out = {}
        accuracies = [t.primary for t in self.tasks if t.metric in ACCURACY_METRICS]
        if accuracies:
            out["avg"] = sum(accuracies) / len(accuracies)
        bpbs = [t.scores["bpb"] for t in self.tasks if "bpb" in t.scores]
        if bpbs:
            out["avg_bpb"] = sum(bpbs) / len(bpbs)
        return out

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat names: ``<prefix>/<task>/<metric>`` for every score, ``<prefix>/avg`` and ``<prefix>/avg_bpb``."""
        out = {f"{prefix}/{t.name}/{name}": value for t in self.tasks for name, value in t.scores.items()}
        out.update({f"{prefix}/{name}": value for name, value in self.averages().items()})
        return out

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tasks)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.tasks)

    def to_markdown(self) -> str:
        """Per-task table (accuracies in percent) with the average last."""
        lines = [
            "| task | metric | score (%) | ce_loss | bpb | questions | rows | rows/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in self.tasks:
            score = f"{100 * t.primary:.2f}" if t.metric in ACCURACY_METRICS else f"{t.primary:.4f}"
            ce, bpb = (f"{t.scores[k]:.4f}" if k in t.scores else "-" for k in REPORTED)
            rate = f"{t.rows / t.seconds:.0f}" if t.seconds > 0 else "-"
            lines.append(f"| {t.name} | {t.metric} | {score} | {ce} | {bpb} | {t.docs} | {t.rows} | {rate} |")
        avg = self.averages()
        if avg:
            score = f"**{100 * avg['avg']:.2f}**" if "avg" in avg else "-"
            bpb = f"**{avg['avg_bpb']:.4f}**" if "avg_bpb" in avg else "-"
            rate = f"{self.rows / self.seconds:.0f}" if self.seconds > 0 else "-"
            docs = sum(t.docs for t in self.tasks)
            lines.append(f"| average ({len(self.tasks)} tasks) | | {score} | | {bpb} | {docs} | {self.rows} | {rate} |")
        return "\n".join(lines)
