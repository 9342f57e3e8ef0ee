"""The compiled training step (``python -m experiments bench --training-step``): every scheme's task module built
as ``fit`` builds it, eager and compiled through training's own compile path, timed interleaved.

Training compiles each trunk Block through the config switch ``parallel.compile``: the task's ``configure_model``
calls :func:`experiments.parallel.compile.compile_blocks` (torchtitan's order: tensor parallelism, activation
checkpointing, compile, FSDP2). Here each candidate is the task's LightningModule (``LanguageModeling``,
``ImageClassification``, ``LatentDiffusion``) built from the workload's shape with ``ParallelConfig(compile=...)``,
and ``configure_model()`` is called on it exactly as Lightning calls it; the optimizer is ``build_optimizer``'s AdamW
and schedule (what ``configure_optimizers`` returns). One measured step is what ``fit`` does per batch on one
device: ``training_step`` (forward and loss, under bf16 autocast with ``--bf16`` as ``bf16-mixed`` does), backward,
AdamW step, the learning-rate schedule's step, ``zero_grad``, and ``on_train_batch_end`` (the EMA update of a task
that keeps one). Gradient clipping and logging are left out (no trainer: ``self.log`` does nothing).

Both modes of every scheme are interleaved round-robin in one process (:func:`experiments.bench.measure.interleave`),
so load drifts hit every scheme and mode alike; warm-up rounds (the compilation) are not timed. Dynamo's graph count
is recorded for every step of every candidate, so the report can show that the compiled candidates compiled (graphs
> 0) during warm-up and did not recompile while timed, and that the eager ones never did. Dynamo's per-function cache
is shared by all Blocks of all schemes in this process (one ``Block.forward``), while training compiles one scheme
per process: the cache limits are raised for the measurement so no scheme falls back to eager silently when the
others have filled the cache.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from experiments.bench.measure import Options, interleave
from experiments.bench.run import RunSpec, label_parts
from experiments.bench.workloads import LM_TASKS, Batch, Workload, make_batch
from experiments.parallel.compile import is_compiled
from experiments.parallel.config import ParallelConfig
from experiments.tasks.optim import OptimConfig, build_optimizer
from models import TrunkConfig

MODES = ("eager", "compiled")
BACKENDS = ("inductor", "aot_eager", "eager")  # ParallelConfig.compile_backend's choices
CACHE_LIMIT = 4096  # dynamo recompilations per function / in all: far above the Blocks of every scheme at once


def dynamo_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (its ``unique_graphs`` counter)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def build_task_module(w: Workload, scheme: str, parallel: ParallelConfig, **trunk_overrides) -> torch.nn.Module:
    """The task's LightningModule for workload ``w`` under ``scheme``, as ``fit`` builds it from a config (task
    defaults for everything the workload does not fix), with ``configure_model()`` run as Lightning runs it on one
    device: with ``parallel.compile`` it compiles each trunk Block
    (:func:`experiments.parallel.compile.compile_blocks`, training's compile path, not a copy of it)."""
    trunk = TrunkConfig(**{**w.trunk, "norm_scheme": scheme, **trunk_overrides})
    optim = OptimConfig()
    if w.task in LM_TASKS:
        from experiments.tasks.lm import LanguageModeling

        module = LanguageModeling(trunk, optim, w.net["vocab_size"], w.net["max_seq_len"], parallel=parallel)
    elif w.task == "vit":
        from experiments.tasks.vit import ImageClassification

        n = w.net
        module = ImageClassification(trunk, optim, n["num_classes"], n["img_size"], n["patch_size"], parallel=parallel)
    else:
        from experiments.tasks.dit import LatentDiffusion

        n = w.net
        module = LatentDiffusion(
            trunk, optim, num_classes=n["num_classes"], latent_size=n["input_size"], latent_channels=n["in_channels"],
            patch_size=n["patch_size"], learn_sigma=n["learn_sigma"], parallel=parallel,
        )  # fmt: skip
    module.configure_model()
    return module


def task_batch(w: Workload, device: torch.device, seed: int = 0) -> Batch | Tensor:
    """The batch a task's ``training_step`` takes, of :func:`make_batch`'s fixed random values: token windows
    ``(B, N + 1)`` for the LM; (images, labels) for the ViT; (latents, labels) for the DiT."""
    batch = make_batch(w, device, seed)
    if w.task in LM_TASKS:
        return batch[0]
    if w.task == "vit":
        return batch
    latents, _, labels, _ = batch
    return latents, labels


@dataclass
class TrainingCandidate:
    """One scheme in one mode: the task module, its optimizer and schedule, the batch; ``times`` collects the
    measured steps (seconds) and ``graphs`` the dynamo graphs compiled during each step, warm-up included."""

    name: str
    scheme: str
    mode: str
    module: torch.nn.Module
    batch: Batch | Tensor
    opts: Options
    times: list[float] = field(default_factory=list)
    graphs: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.module.to(self.opts.device).train()
        optimizers = build_optimizer(self.module.net, self.module.optim_cfg, 1 << 20, 1 << 20)
        self.optimizer = optimizers["optimizer"]
        self.scheduler = optimizers["lr_scheduler"]["scheduler"]
        self.index = 0

    @property
    def compiled(self) -> bool:
        """Whether training's compile path compiled this module's trunk Blocks."""
        return is_compiled(self.module.net.trunk)

    def step(self) -> None:
        """One optimizer step as ``fit`` takes it on one device (no clipping, no logging)."""
        before = dynamo_graphs()
        autocast = torch.autocast(self.opts.device.type, torch.bfloat16) if self.opts.bf16 else nullcontext()
        with autocast, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*self.log.*")  # no trainer: logging is a no-op
            loss = self.module.training_step(self.batch, self.index)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.module.on_train_batch_end(loss, self.batch, self.index)
        self.index += 1
        self.graphs.append(dynamo_graphs() - before)

    def timed_graphs(self, warmup: int) -> int:
        """Graphs compiled during the timed steps (0 unless a guard failed after warm-up)."""
        return sum(self.graphs[warmup:])


def build_training_candidates(
    w: Workload, spec: RunSpec, opts: Options, backend: str = "inductor"
) -> list[TrainingCandidate]:
    """Every scheme label of ``spec`` eager and compiled (``ParallelConfig(compile=..., compile_backend=backend)``),
    each from the same seed, with activation checkpointing when ``opts.checkpointing``."""
    if backend not in BACKENDS:
        raise ValueError(f"compile backend {backend!r}; valid: {', '.join(BACKENDS)}")
    batch = task_batch(w, opts.device, spec.seed)
    cands = []
    for label in spec.schemes:
        scheme, overrides = label_parts(label, spec.recompute_norms)
        for mode in MODES:
            parallel = ParallelConfig(compile=mode == "compiled", compile_backend=backend)
            torch.manual_seed(spec.seed)  # the same init in both modes
            with opts.device:
                module = build_task_module(
                    w, scheme, parallel, activation_checkpointing=opts.checkpointing, **overrides
                )
            cands.append(TrainingCandidate(label, scheme, mode, module, batch, opts))
    return cands


def measure_training_step(
    w: Workload, spec: RunSpec, opts: Options, backend: str = "inductor"
) -> list[TrainingCandidate]:
    """Builds every candidate and times ``spec.steps`` interleaved rounds after ``spec.warmup`` untimed ones (the
    compilation), dynamo's cache limits raised for the run (one ``Block.forward`` for every scheme here)."""
    cands = build_training_candidates(w, spec, opts, backend)
    limits = {"cache_size_limit": CACHE_LIMIT, "accumulated_cache_size_limit": CACHE_LIMIT}
    with torch._dynamo.config.patch(limits):
        interleave(cands, spec.steps, spec.warmup)
    return cands


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval of the median of ``values``: the order statistics ``x_(k)`` and ``x_(n+1-k)``
    with the largest ``k`` whose coverage (:func:`interval_coverage`) is at least ``confidence`` (for 15 values,
    the 4th and 12th: 96.5 %). With too few values for that (fewer than 6 at 95 %) it is their range."""
    xs = sorted(values)
    if not xs:
        return math.nan, math.nan
    k, _ = _order_statistic(len(xs), confidence)
    return xs[k - 1], xs[len(xs) - k]


def interval_coverage(n: int, confidence: float = 0.95) -> float:
    """The coverage of :func:`median_interval` over ``n`` values: ``1 - 2 P(Binomial(n, 1/2) < k)``."""
    return _order_statistic(n, confidence)[1]


def _order_statistic(n: int, confidence: float) -> tuple[int, float]:
    """The rank ``k`` (1-based, at least 1: the range) and its coverage."""
    below, k = 1 / 2**n, 1  # below = P(Binomial(n, 1/2) < k)
    while k < (n + 1) // 2:
        nxt = below + math.comb(n, k) / 2**n  # P(Binomial < k + 1)
        if 1 - 2 * nxt < confidence:
            break
        below, k = nxt, k + 1
    return k, 1 - 2 * below
