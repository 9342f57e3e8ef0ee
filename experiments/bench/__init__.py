"""Training-step benchmark: every norm scheme side by side, and our ``pre`` against timm / diffusers / transformers.

    python -m experiments bench                                  # lm, vit, dit at tiny size, every scheme
    python -m experiments bench --task lm --size small --schemes pre,siamese --steps 30 --bf16
    python -m experiments bench --task lm --schemes pre,siamese,siamese@off   # recomputed norms on / off
    python -m experiments bench --task lm --schemes pre,pre:dyt,siamese:dyt   # another norm layer (DyT)
    python -m experiments bench --task moe --size small --schemes pre,siamese,siamese_hybrid  # MoE LM (64 x top-8)
    python -m experiments bench --scaling                        # overhead vs width and depth (scaling.md/png)
    python -m experiments bench --training-step --task lm --schemes pre,post,siamese   # eager vs compiled training

Method (timings on a shared machine are noisy, so every number is relative and robust):

- One model and one AdamW per candidate, built once; every measured step is zero_grad + forward +
  loss + backward + optimizer step on a fixed batch (CUDA is synchronized around it).
- Candidates are interleaved round-robin (A, B, C, A, B, C, ...; each round starts one candidate
  later), so load changes hit all of them alike. Step time is the median over rounds; a ratio is the
  median over rounds of the per-round ratio to the baseline (``pre``, or the reference library).
- Activation memory is the bytes of the distinct storages autograd saves for backward during one
  forward (a ``saved_tensors_hooks`` pack hook; parameters excluded, bf16 weight copies included):
  what the paper's "2% more activation memory" counts, on any device, eager or compiled. On CUDA the
  peak allocated memory of one step (above what is resident before it) is reported as well.
- Reference rows load the reference network's weights into ours (``models.loaders``), so both run
  the same function; the loss gap at init is reported as proof. No timing is ever asserted.
- With ``--norm-share`` (always in ``--scaling``) a few profiled steps per candidate give the share of
  step time spent in normalization ops (:func:`experiments.bench.measure.norm_time_share`).
- CPU runs use one intra-op thread by default (``--threads``): on a shared machine a second OpenMP
  thread waits at barriers and multiplies step times several-fold.

``--training-step`` (:mod:`experiments.bench.training_step`) times the training step as ``fit`` takes it instead:
each scheme's task module (``LanguageModeling``, ...) built as training builds it, once eager and once compiled
through training's own switch (``parallel.compile``: the task's ``configure_model`` compiles each trunk Block,
:mod:`experiments.parallel.compile`), every scheme and mode interleaved in one process after untimed warm-up
rounds (the compilation); the ratio to ``pre`` per mode with a distribution-free interval, and dynamo's graph
counts as proof that the compiled modules compiled (``training_step.md`` / ``.csv`` / ``.json``, raw times in the
JSON).

Each SiameseNorm row also gets a line with the paper's overhead claim beside it (-0.5 % throughput and +2 %
activation memory on a 15B MoE, < 0.1 % parameters; :mod:`experiments.bench.claims`).

Outputs ``bench.md`` and ``bench.csv`` in ``--out`` (default ``runs/bench/<task>-<size>/``; with
``--training-step`` ``training_step.{md,csv,json}`` in ``runs/bench/training-step-<task>-<size>/``).
"""

from __future__ import annotations

from experiments.bench.claims import claim_lines, paper_overhead
from experiments.bench.cli import build_parser, main, parse_schemes
from experiments.bench.measure import (
    Candidate,
    Options,
    activation_bytes,
    alive_after_forward_bytes,
    interleave,
    norm_time_share,
    peak_step_bytes,
    saved_tensor_bytes,
    step_flops,
)
from experiments.bench.references import OURS, Reference, reference, reference_candidates
from experiments.bench.report import (
    COLUMNS,
    SCHEME_TARGETS,
    Row,
    Target,
    machine_info,
    markdown,
    paired_ratio,
    summarize,
    targets,
    write_report,
)
from experiments.bench.run import (
    RECOMPUTE_LABELS,
    RunSpec,
    bench_task,
    bench_tasks,
    build_candidate,
    data_batches_per_s,
    data_row,
    label_parts,
)
from experiments.bench.scaling import (
    SCALING_COLUMNS,
    ScalingRow,
    bench_scaling,
    plot_scaling,
    scaling_targets,
    scaling_workloads,
    write_scaling,
)
from experiments.bench.training_report import (
    TRAINING_COLUMNS,
    TrainingRow,
    bench_training_steps,
    summarize_training,
    training_markdown,
    write_training,
)
from experiments.bench.training_step import (
    TrainingCandidate,
    build_task_module,
    interval_coverage,
    measure_training_step,
    median_interval,
)
from experiments.bench.workloads import (
    LM_TASKS,
    OUR_LOSS,
    SIZES,
    TASKS,
    Batch,
    LossFn,
    Task,
    Workload,
    build_ours,
    dit_loss,
    lm_loss,
    lm_workload,
    make_batch,
    moe_loss,
    moe_workload,
    vit_loss,
)

__all__ = [
    "Batch",
    "COLUMNS",
    "Candidate",
    "LM_TASKS",
    "LossFn",
    "OURS",
    "OUR_LOSS",
    "Options",
    "RECOMPUTE_LABELS",
    "Reference",
    "Row",
    "RunSpec",
    "SCALING_COLUMNS",
    "SCHEME_TARGETS",
    "SIZES",
    "ScalingRow",
    "TASKS",
    "TRAINING_COLUMNS",
    "Target",
    "Task",
    "TrainingCandidate",
    "TrainingRow",
    "Workload",
    "activation_bytes",
    "alive_after_forward_bytes",
    "bench_scaling",
    "bench_task",
    "bench_tasks",
    "bench_training_steps",
    "build_candidate",
    "build_ours",
    "build_parser",
    "build_task_module",
    "claim_lines",
    "data_batches_per_s",
    "data_row",
    "dit_loss",
    "interleave",
    "interval_coverage",
    "label_parts",
    "lm_loss",
    "lm_workload",
    "machine_info",
    "main",
    "make_batch",
    "markdown",
    "measure_training_step",
    "median_interval",
    "moe_loss",
    "moe_workload",
    "norm_time_share",
    "paired_ratio",
    "paper_overhead",
    "parse_schemes",
    "peak_step_bytes",
    "plot_scaling",
    "reference",
    "reference_candidates",
    "saved_tensor_bytes",
    "scaling_targets",
    "scaling_workloads",
    "step_flops",
    "summarize",
    "summarize_training",
    "targets",
    "training_markdown",
    "vit_loss",
    "write_report",
    "write_scaling",
    "write_training",
]
