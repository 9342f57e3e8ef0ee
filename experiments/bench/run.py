"""The benchmark driver shared by ``python -m experiments.bench`` and ``scripts/gpu_bench.py``: ``RunSpec``
(what to measure), ``bench_task`` (one workload: its schemes interleaved, the reference pair, the data
loader) and ``bench_tasks`` (several in turn), plus the text DataModule's loader timing and optional
torch.profiler op tables."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.bench.measure import Candidate, Options, interleave
from experiments.bench.references import reference, reference_candidates
from experiments.bench.report import Row, summarize
from experiments.bench.workloads import OUR_LOSS, Workload, build_ours, make_batch


@dataclass
class RunSpec:
    """What one ``bench_task`` call measures, besides the workload and the device options."""

    schemes: Sequence[str]
    steps: int = 15
    warmup: int = 3
    seed: int = 0
    reference: bool = True
    data_batches: int = 0
    data_dir: str = "data/text"
    profile_dir: Path | None = None
    peak_tflops: float | None = None  # count FLOPs and report MFU (NaN: count, no MFU)
    norm_share: bool = False  # profile a few steps per candidate for the share of step time in norms
    recompute_norms: bool | str = "auto"  # TrunkConfig.recompute_norms of labels without an @on / @off suffix


#: A scheme label's ``@`` suffix -> ``TrunkConfig.recompute_norms``.
RECOMPUTE_LABELS: dict[str, bool | str] = {"on": True, "off": False, "auto": "auto"}


def label_parts(label: str, recompute_norms: bool | str = "auto") -> tuple[str, dict]:
    """A scheme label ``scheme[:norm_layer][@on|@off|@auto][#k]`` as the scheme and its ``TrunkConfig`` overrides
    (the norm layer instead of the workload's; ``recompute_norms``, ``recompute_norms`` when no suffix names it);
    the repeat index ``#k`` only tells two candidates apart."""
    base, _, recompute = label.split("#")[0].partition("@")
    scheme, _, layer = base.partition(":")
    overrides = {"recompute_norms": RECOMPUTE_LABELS[recompute] if recompute else recompute_norms}
    return scheme, overrides | ({"norm_layer": layer} if layer else {})


def build_candidate(w: Workload, label: str, spec: RunSpec, opts: Options) -> Candidate:
    """Our network for a scheme label (:func:`label_parts`)."""
    scheme, overrides = label_parts(label, spec.recompute_norms)
    torch.manual_seed(spec.seed)  # same draws wherever two schemes share a structure
    with opts.device:  # built in place: no host-side init of large models
        model = build_ours(w, scheme, activation_checkpointing=opts.checkpointing, **overrides)
    return Candidate(label, model, OUR_LOSS[w.task], make_batch(w, opts.device, spec.seed), opts)


def bench_task(w: Workload, size: str, spec: RunSpec, opts: Options) -> tuple[list[Row], list[str]]:
    """Rows and notes for one workload: schemes interleaved, then the reference pair, then the data loader."""
    rows, notes = [], []
    batch = make_batch(w, opts.device, spec.seed)
    cands = [build_candidate(w, label, spec, opts) for label in spec.schemes]
    print(f"[{w.task}/{size}] {len(cands)} schemes x {spec.steps} rounds ...", flush=True)
    interleave(cands, spec.steps, spec.warmup)
    baseline = "pre" if "pre" in spec.schemes else spec.schemes[0]
    rows += summarize(cands, w, size, "schemes", baseline, spec.peak_tflops, spec.norm_share)
    if spec.profile_dir is not None:
        _profile(cands, spec.profile_dir, w.task)
    del cands
    if spec.reference:
        torch.manual_seed(spec.seed)
        with opts.device:
            ref = reference(w, opts.checkpointing)
        if isinstance(ref, str):
            notes.append(f"{w.task}/{size} reference {ref}")
            print(f"[{w.task}/{size}] reference {ref}", flush=True)
        else:
            cands = reference_candidates(ref, w, batch, opts)
            print(f"[{w.task}/{size}] ours vs {ref.name} x {spec.steps} rounds ...", flush=True)
            interleave(cands, spec.steps, spec.warmup)
            rows += summarize(cands, w, size, "reference", ref.name, spec.peak_tflops, spec.norm_share)
            del cands
    if opts.device.type == "cuda":
        torch.cuda.empty_cache()
    if w.task == "lm" and spec.data_batches > 0:
        train = next(r for r in rows if r.group == "schemes" and r.name == baseline)
        rows.append(data_row(w, size, train, spec.data_batches, spec.data_dir))
    return rows, notes


def bench_tasks(
    workloads: Iterable[Workload], size: str, spec: RunSpec, opts: Options, header: dict[str, str]
) -> tuple[list[Row], list[str]]:
    """:func:`bench_task` for each workload in turn, their rows and notes together; ``header`` gets the wall time."""
    rows, notes = [], []
    start = time.perf_counter()
    for w in workloads:
        task_rows, task_notes = bench_task(w, size, spec, opts)
        rows += task_rows
        notes += task_notes
    header["wall time"] = f"{time.perf_counter() - start:.0f} s"
    return rows, notes


def data_row(w: Workload, size: str, train: Row, batches: int, data_dir: str) -> Row:
    """The text DataModule's loader against the training step of ``train`` (time ratio: data / training)."""
    per_s = data_batches_per_s(w, batches, data_dir)
    ms = 1e3 / per_s
    shape = f"{batches} batches of {w.batch_size} x {w.net['max_seq_len'] + 1} tokens"
    return Row(
        w.task, size, "data", "TextDataModule train loader (embedded, byte)", f"{train.name} training step",
        ms, math.nan, math.nan, per_s, "batches/s", ms / train.step_ms, *[math.nan] * 4, 0, 0.0, math.nan,
        note=f"{shape}; num_workers=0",
    )  # fmt: skip


def data_batches_per_s(w: Workload, batches: int, data_dir: str) -> float:
    """Batches/s of the text DataModule's training loader (embedded corpus) at the LM workload's shape."""
    from datamodules.text.datamodule import TextDataModule

    dm = TextDataModule(source="embedded", data_dir=data_dir, seq_len=w.net["max_seq_len"], batch_size=w.batch_size)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    it = iter(loader)
    next(it)  # the first batch pays for worker/memmap start-up
    start = time.perf_counter()
    for _ in range(batches):
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)
    return batches / (time.perf_counter() - start)


def _profile(cands: Sequence[Candidate], out: Path, task: str, steps: int = 3) -> None:
    """torch.profiler op tables (self CPU time) of a few steps per candidate, to find avoidable overhead."""
    from torch.profiler import ProfilerActivity, profile

    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cands[0].opts.device.type == "cuda" else [])
    for c in cands:
        with profile(activities=activities) as prof:
            for _ in range(steps):
                c.step()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        (out / f"profile-{task}-{c.name.replace('#', '_')}.txt").write_text(table)
