"""What one candidate costs: ``Candidate`` (a network with its own AdamW, batch and loss), the interleaved
round-robin timing loop, and the per-step measures: saved-for-backward activation bytes (a saved-tensor
hook), bytes alive after forward (CPU profiler), peak step memory (CUDA) and model FLOPs (torch's counter)."""

from __future__ import annotations

import gc
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from experiments.bench.workloads import Batch, LossFn
from experiments.tasks.optim import param_groups


@dataclass
class Options:
    """How every candidate is run."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    bf16: bool = False
    compile: bool = False
    checkpointing: bool = False
    lr: float = 1e-4


@dataclass
class Candidate:
    """A network with its own optimizer, batch and loss; ``times`` collects its measured steps."""

    name: str
    model: nn.Module
    loss: LossFn
    batch: Batch
    opts: Options
    note: str = ""
    times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model.to(self.opts.device).train()
        fused = self.opts.device.type == "cuda"  # as experiments/optim.py picks it
        self.optimizer = torch.optim.AdamW(param_groups(self.model, 0.1), lr=self.opts.lr, fused=fused or None)
        # a compiled wrapper sharing the parameters (FLOPs are counted on the eager ``model``)
        self.forward_model = torch.compile(self.model) if self.opts.compile else self.model

    def autocast(self):
        return torch.autocast(self.opts.device.type, torch.bfloat16) if self.opts.bf16 else nullcontext()

    def compute_loss(self) -> Tensor:
        with self.autocast():
            return self.loss(self.forward_model, self.batch)

    def step(self) -> None:
        """One training step: zero_grad, forward, backward, AdamW."""
        self.optimizer.zero_grad(set_to_none=True)
        self.compute_loss().backward()
        self.optimizer.step()

    @property
    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleave(candidates: Sequence[Candidate], steps: int, warmup: int) -> None:
    """Round-robin training steps; round r visits the candidates starting at index r mod n."""
    n = len(candidates)
    for r in range(warmup + steps):
        for c in candidates[r % n :] + candidates[: r % n]:
            _sync(c.opts.device)
            start = time.perf_counter()
            c.step()
            _sync(c.opts.device)
            if r >= warmup:
                c.times.append(time.perf_counter() - start)


def saved_tensor_bytes(fn: Callable[[], Tensor], exclude: Iterable[Tensor] = ()) -> tuple[int, Tensor]:
    """Bytes of the distinct storages autograd saves for backward while ``fn()`` runs, and its result.

    Storages are counted once however many views of them are saved; tensors sharing storage with
    ``exclude`` (the parameters) are skipped. Keep the result alive while the count matters: the
    saved tensors live exactly as long as the graph behind it.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    saved: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(saved.values()), out


def activation_bytes(c: Candidate) -> int:
    """Saved-for-backward bytes of one forward + loss, through the compiled graph when there is one (its
    saved tensors pass the same hook, after the compiler's fusion and recompute choices)."""
    c.optimizer.zero_grad(set_to_none=True)
    with c.autocast():
        nbytes, loss = saved_tensor_bytes(lambda: c.loss(c.forward_model, c.batch), c.model.parameters())
    del loss
    return nbytes


def alive_after_forward_bytes(c: Candidate) -> float:
    """CPU only: bytes allocated by one forward + loss and still alive at its end (profiler memory events).

    An independent check of :func:`activation_bytes` that also sees tensors kept outside autograd (e.g. in a
    closure). The count is allocations minus frees inside the window, so a free of anything allocated
    before it would subtract: the garbage collector runs first and is off during the window (the previous
    measurement's graph, held in reference cycles by checkpoint frames, would otherwise be freed in it).
    """
    if c.opts.device.type != "cpu":
        return math.nan
    from torch.profiler import ProfilerActivity, profile

    c.optimizer.zero_grad(set_to_none=True)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    gc.collect()
    gc.disable()
    try:
        with _quiet_stderr():  # the profiler back end logs every start and stop to the C stderr
            prof.start()
        try:
            with c.autocast():
                loss = c.loss(c.forward_model, c.batch)
        finally:
            with _quiet_stderr():
                prof.stop()
        del loss
    finally:
        gc.enable()
    return float(sum(e.self_cpu_memory_usage for e in prof.events()))


#: Profiler event names of normalization ops: ATen's layer/RMS norms (forward and backward), the lean
#: RMSNorm's autograd function (models.norms), and their autograd nodes.
NORM_EVENT = re.compile(r"(layer|rms|group)_?norm", re.IGNORECASE)


def norm_time_share(c: Candidate, steps: int = 3) -> float:
    """Share of the training step spent in normalization ops, from ``torch.profiler``: the median over
    ``steps`` steps, each profiled on its own (a preempted step then spoils one sample, not the mean).

    CPU: the union of the time intervals of norm events (forward, backward, and recomputation inside
    backward; nested events counted once) over the step's wall time. CUDA: the device time of kernels
    launched by norm events over all kernel time. NaN under ``torch.compile``: its generated kernels fuse
    norms with their neighbours, so no event is a norm. The profiler's per-op overhead inflates small ops.
    """
    if c.opts.compile:
        return math.nan
    c.step()  # the profiler's own first-use cost stays out of the window
    return statistics.median(_profiled_norm_share(c) for _ in range(steps))


def _profiled_norm_share(c: Candidate) -> float:
    from torch.profiler import ProfilerActivity, profile

    cuda = c.opts.device.type == "cuda"
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
    with _quiet_stderr():
        prof.start()
    _sync(c.opts.device)
    start = time.perf_counter()
    try:
        c.step()
        _sync(c.opts.device)
    finally:
        wall = time.perf_counter() - start
        with _quiet_stderr():
            prof.stop()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    if cuda:
        norm_ids = {id(e) for e in events if NORM_EVENT.search(e.name)}
        top = [e for e in events if id(e) in norm_ids and not _has_ancestor(e, norm_ids)]
        total = sum(e.self_device_time_total for e in events)
        return sum(e.device_time_total for e in top) / total if total else math.nan
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if NORM_EVENT.search(e.name))
    covered, end = 0.0, -math.inf
    for lo, hi in spans:  # union of intervals, microseconds
        if hi > end:
            covered += hi - max(lo, end)
            end = hi
    return covered / 1e6 / wall


def _has_ancestor(e, ids: set[int]) -> bool:
    parent = e.cpu_parent
    while parent is not None:
        if id(parent) in ids:
            return True
        parent = parent.cpu_parent
    return False


@contextmanager
def _quiet_stderr():
    """Points file descriptor 2 at /dev/null for the block (C++ logging bypasses ``sys.stderr``)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def peak_step_bytes(c: Candidate) -> float:
    """CUDA only: peak allocated memory during one step, above what was resident before it."""
    if c.opts.device.type != "cuda":
        return math.nan
    c.optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(c.opts.device)
    torch.cuda.reset_peak_memory_stats(c.opts.device)
    base = torch.cuda.memory_allocated(c.opts.device)
    c.step()
    torch.cuda.synchronize(c.opts.device)
    return float(torch.cuda.max_memory_allocated(c.opts.device) - base)


def step_flops(c: Candidate) -> float:
    """FLOPs of one forward + backward (matmuls, convolutions, attention; eager), as torch's FLOP counter
    sees them. Attention counts in full even when causal (as PaLM's MFU does), and its backward includes
    the recomputed scores (3.5x the forward where PaLM counts 3x). CPU SDPA is mapped here because the
    counter only knows the CUDA kernels."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    cpu_sdpa = {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, **kw: sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: (
            lambda g, q, k, v, *a, **kw: sdpa_backward_flop_count(g, q, k, v)
        ),
    }
    c.optimizer.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter, c.autocast():
        c.loss(c.model, c.batch).backward()
    c.optimizer.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())
