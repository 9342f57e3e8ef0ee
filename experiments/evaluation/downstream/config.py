"""What a downstream evaluation runs: which OLMo in-loop tasks, how many questions each, how it is batched.

Importing this module loads nothing heavy (``olmo_eval`` pulls in ``datasets`` and ``pyarrow``): a task
module can take a :class:`DownstreamConfig` argument without paying for it when the config is unset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The OLMo in-loop set of HybridNorm's 1.2B config (which the SiameseNorm LM runs build on), zero-shot;
# MMLU as OLMo's four category tasks over its validation split. Names are ``olmo_eval.list_tasks()`` labels.
DEFAULT_TASKS: tuple[str, ...] = (
    "piqa",
    "hellaswag",
    "winogrande",
    "openbook_qa",
    "boolq",
    "sciq",
    "arc_easy",
    "arc_challenge",
    "copa",
    "commonsense_qa",
    "social_iqa",
    "basic_arithmetic",
    "mmlu_stem",
    "mmlu_humanities",
    "mmlu_social_sciences",
    "mmlu_other",
)
# Metric types whose score is an accuracy (higher is better) and enters the downstream average.
ACCURACY_METRICS = ("acc", "len_norm", "f1")
# Metric types this evaluator scores; "pmi_dc" needs a second, domain-conditional forward it does not run.
SUPPORTED_METRICS = (*ACCURACY_METRICS, "ce_loss", "bpb")
SAMPLE_SEED = 1234  # OLMES subsamples large tasks with random.Random(1234); so does `limit` here


@dataclass
class DownstreamConfig:
    """A downstream evaluation (OLMo's in-loop tasks, scored by ``olmo_eval.metrics.ICLMetric``).

    Attributes:
        tasks: ``olmo_eval`` task labels; the default is :data:`DEFAULT_TASKS`.
        limit: questions scored per task (a seeded sample of the scorable ones); None scores them all.
        batch_size: (context, continuation) rows per forward pass; rows are sorted by length first.
        seed: seed of the ``limit`` sample.
    """

    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    limit: int | None = None
    batch_size: int = 32
    seed: int = SAMPLE_SEED

    def __post_init__(self) -> None:
        self.tasks = list(self.tasks)
        if not self.tasks:
            raise ValueError("downstream.tasks is empty; valid: a list of olmo_eval task names, e.g. piqa, hellaswag")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"downstream.tasks={self.tasks} names a task twice; valid: each task once")
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"downstream.limit={self.limit} must be a positive number of questions, or null for all")
        if self.batch_size <= 0:
            raise ValueError(f"downstream.batch_size={self.batch_size} must be a positive integer")
        check_task_names(self.tasks)


def check_task_names(tasks: list[str]) -> None:
    """Raises a one-line ValueError naming the first label ``olmo_eval`` does not know."""
    from olmo_eval import list_tasks  # here, not at import: it loads datasets and pyarrow

    known = set(list_tasks())
    for name in tasks:
        if name not in known:
            close = sorted(k for k in known if name.split("_")[0] in k)[:8] or sorted(DEFAULT_TASKS)
            raise ValueError(
                f"unknown downstream task {name!r}; valid: olmo_eval.list_tasks() labels, e.g. {', '.join(close)}"
            )
