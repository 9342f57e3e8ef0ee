"""Training-step benchmark: every norm scheme side by side, and our ``pre`` against timm / diffusers / transformers.

    python -m experiments.bench                                  # lm, vit, dit at tiny size, every scheme
    python -m experiments.bench --task lm --size small --schemes pre,siamese --steps 30 --bf16

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
- CPU runs use one intra-op thread by default (``--threads``): on a shared machine a second OpenMP
  thread waits at barriers and multiplies step times several-fold.

Outputs ``bench.md`` and ``bench.csv`` in ``--out`` (default ``runs/bench/<task>-<size>/``).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.optim import param_groups
from models import DiT, LanguageModel, TrunkConfig, ViTClassifier
from models.presets import PRESETS
from models.schemes import NormScheme

Task = Literal["lm", "vit", "dit"]
TASKS: tuple[Task, ...] = ("lm", "vit", "dit")
Batch = tuple[Tensor, ...]
LossFn = Callable[[nn.Module, Batch], Tensor]

#################################################################################
#                        Workloads: task x size, as data                        #
#################################################################################


@dataclass(frozen=True)
class Workload:
    """One task at one size: the trunk, the network around it and the batch.

    Attributes:
        task: "lm" (tokens/s), "vit" or "dit" (images/s).
        trunk: ``TrunkConfig`` fields except the scheme.
        net: the network's own arguments (vocab/seq for the LM, image/latent/patch sizes otherwise).
        batch_size: rows per step.
    """

    task: Task
    trunk: dict
    net: dict
    batch_size: int

    @property
    def unit(self) -> str:
        return "tokens" if self.task == "lm" else "images"

    @property
    def units_per_step(self) -> int:
        return self.batch_size * (self.net["max_seq_len"] if self.task == "lm" else 1)


def _lm(batch: int, seq: int, **trunk) -> Workload:  # the LM presets' flavour: SwiGLU, RMSNorm, QK-norm, no bias
    return Workload("lm", {**PRESETS["lm-tiny"].trunk, **trunk}, dict(vocab_size=256, max_seq_len=seq), batch)


def _vit(batch: int, img: int, patch: int, classes: int, **trunk) -> Workload:
    net = dict(img_size=img, patch_size=patch, in_chans=3, num_classes=classes)
    return Workload("vit", {**PRESETS["vit-tiny"].trunk, **trunk}, net, batch)


def _dit(batch: int, latent: int, patch: int, classes: int, **trunk) -> Workload:
    net = dict(input_size=latent, patch_size=patch, in_channels=4, num_classes=classes, learn_sigma=False)
    return Workload("dit", {**PRESETS["dit-tiny"].trunk, **trunk}, net, batch)


# fmt: off
SIZES: dict[str, dict[Task, Workload]] = {
    # micro: seconds, for tests
    "micro": {"lm": _lm(4, 32, dim=32, depth=2, num_heads=2, mlp_hidden=64),
              "vit": _vit(8, 16, 4, 10, dim=32, depth=2, num_heads=2),
              "dit": _dit(8, 4, 2, 10, dim=32, depth=2, num_heads=2)},
    # tiny: the shipped configs/{lm,vit,dit}/tiny.yaml models and batches
    "tiny":  {"lm": _lm(32, 128, dim=128, depth=4, num_heads=4, mlp_hidden=512),
              "vit": _vit(128, 28, 7, 10, dim=128, depth=4, num_heads=4),
              "dit": _dit(128, 8, 2, 10, dim=128, depth=4, num_heads=4)},
    # small: LM d256 x 6; DeiT-T at 64 px; DiT-S/2 at 16x16 latents
    "small": {"lm": _lm(16, 256, dim=256, depth=6, num_heads=4, mlp_hidden=1024),
              "vit": _vit(64, 64, 8, 100, dim=192, depth=12, num_heads=3),
              "dit": _dit(32, 16, 2, 1000, dim=384, depth=12, num_heads=6)},
}
# fmt: on

#################################################################################
#                        Networks, batches and losses                           #
#################################################################################


def build_ours(w: Workload, scheme: str, **trunk_overrides) -> nn.Module:
    """Our network for workload ``w`` under ``scheme`` (on the current default device)."""
    cfg = TrunkConfig(**{**w.trunk, "norm_scheme": scheme, **trunk_overrides})
    if w.task == "lm":
        return LanguageModel(cfg, **w.net)
    if w.task == "vit":
        return ViTClassifier(cfg, **w.net)
    return DiT(cfg, **w.net)


def make_batch(w: Workload, device: torch.device, seed: int = 0) -> Batch:
    """A fixed random batch of the workload's shape (the model does the same work on any values)."""
    g = torch.Generator().manual_seed(seed)
    b, n = w.batch_size, w.net
    if w.task == "lm":
        batch = (torch.randint(n["vocab_size"], (b, n["max_seq_len"] + 1), generator=g),)
    elif w.task == "vit":
        images = torch.randn(b, n["in_chans"], n["img_size"], n["img_size"], generator=g)
        batch = (images, torch.randint(n["num_classes"], (b,), generator=g))
    else:
        latents = torch.randn(b, n["in_channels"], n["input_size"], n["input_size"], generator=g)
        t, y = torch.randint(1000, (b,), generator=g), torch.randint(n["num_classes"], (b,), generator=g)
        batch = (latents, t, y, torch.randn(latents.shape, generator=g))
    return tuple(x.to(device) for x in batch)


def lm_loss(forward: Callable[[Tensor], Tensor]) -> LossFn:
    """Next-token cross-entropy; ``forward(model, ids) -> logits`` adapts any LM."""
    return lambda model, batch: F.cross_entropy(
        forward(model, batch[0][:, :-1]).flatten(0, 1).float(), batch[0][:, 1:].flatten()
    )


def vit_loss(model: nn.Module, batch: Batch) -> Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def dit_loss(forward: Callable[..., Tensor]) -> LossFn:
    """Epsilon-prediction MSE on the noise channels (the noising itself is not what we time)."""

    def loss(model: nn.Module, batch: Batch) -> Tensor:
        x, t, y, noise = batch
        return F.mse_loss(forward(model, x, t, y)[:, : x.shape[1]].float(), noise)

    return loss


OUR_LOSS: dict[Task, LossFn] = {
    "lm": lm_loss(lambda m, ids: m(ids)),
    "vit": vit_loss,
    "dit": dit_loss(lambda m, x, t, y: m(x, t, y)),
}

#################################################################################
#                        Candidates and the interleaved loop                    #
#################################################################################


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

    An independent check of :func:`activation_bytes`, and the only one of the two that sees inputs which
    activation checkpointing keeps in its closure rather than in autograd (a NamedTuple state).
    """
    if c.opts.device.type != "cpu":
        return math.nan
    from torch.profiler import ProfilerActivity, profile

    c.optimizer.zero_grad(set_to_none=True)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # the profiler back end logs every start and stop to the C stderr
        prof.start()
    try:
        with c.autocast():
            loss = c.loss(c.forward_model, c.batch)
    finally:
        with _quiet_stderr():
            prof.stop()
    del loss
    return float(sum(e.self_cpu_memory_usage for e in prof.events()))


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


#################################################################################
#                        Rows: medians and ratios                               #
#################################################################################


@dataclass
class Row:
    """One line of the results table (also one CSV row)."""

    task: str
    size: str
    group: str  # "schemes", "reference" or "data"
    name: str
    baseline: str
    step_ms: float
    step_ms_p25: float
    step_ms_p75: float
    throughput: float
    unit: str
    step_ratio: float
    act_mb: float
    act_ratio: float
    alive_mb: float
    alive_ratio: float
    params: int
    param_mb: float
    param_ratio: float
    peak_mb: float = math.nan
    tflop: float = math.nan  # model FLOPs per step / 1e12 (scripts/gpu_bench.py)
    mfu: float = math.nan  # tflop / step time / the device's peak
    note: str = ""


COLUMNS = [f.name for f in fields(Row)]


def _quantile(xs: Sequence[float], q: float) -> float:
    return statistics.quantiles(xs, n=4, method="inclusive")[int(q * 4) - 1] if len(xs) > 1 else xs[0]


def paired_ratio(times: Sequence[float], base: Sequence[float]) -> float:
    """Median over rounds of ``times[r] / base[r]``: robust to load that drifts between rounds."""
    return statistics.median(t / b for t, b in zip(times, base, strict=True))


def summarize(
    candidates: Sequence[Candidate], w: Workload, size: str, group: str, baseline: str, peak_tflops: float | None = None
) -> list[Row]:
    """One row per candidate, ratios against the candidate named ``baseline``.

    With ``peak_tflops`` (NaN when unknown) model FLOPs per step are counted, and MFU computed against it.
    """
    base = next(c for c in candidates if c.name == baseline)
    acts = {c.name: activation_bytes(c) for c in candidates}
    alive = {c.name: alive_after_forward_bytes(c) for c in candidates}
    rows = []
    for c in candidates:
        step = statistics.median(c.times)
        tflop = step_flops(c) / 1e12 if peak_tflops is not None else math.nan
        rows.append(
            Row(
                task=w.task,
                size=size,
                group=group,
                name=c.name,
                baseline=baseline,
                step_ms=1e3 * step,
                step_ms_p25=1e3 * _quantile(c.times, 0.25),
                step_ms_p75=1e3 * _quantile(c.times, 0.75),
                throughput=w.units_per_step / step,
                unit=f"{w.unit}/s",
                step_ratio=paired_ratio(c.times, base.times),
                act_mb=acts[c.name] / 2**20,
                act_ratio=acts[c.name] / acts[baseline],
                alive_mb=alive[c.name] / 2**20,
                alive_ratio=alive[c.name] / alive[baseline],
                params=c.num_params,
                param_mb=c.param_bytes / 2**20,
                param_ratio=c.param_bytes / base.param_bytes,
                peak_mb=peak_step_bytes(c) / 2**20,
                tflop=tflop,
                mfu=tflop / step / peak_tflops if peak_tflops else math.nan,
                note=c.note,
            )
        )
    return rows


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


#################################################################################
#                        Reference implementations                              #
#################################################################################


@dataclass
class Reference:
    """A reference network at our shapes, and our ``pre`` network (with its weights when a loader exists)."""

    name: str
    theirs: nn.Module
    ours: nn.Module
    loss: LossFn
    same_weights: bool


def reference(w: Workload, checkpointing: bool = False) -> Reference | str:
    """timm (ViT), diffusers (DiT) or transformers (LM) at the workload's shapes, or why not."""
    cfg = TrunkConfig(**{**w.trunk, "norm_scheme": "pre", "activation_checkpointing": checkpointing})
    n = w.net
    if w.task == "vit":
        from timm.models.vision_transformer import VisionTransformer

        from models.loaders import vit_from_timm

        theirs = VisionTransformer(
            img_size=n["img_size"], patch_size=n["patch_size"], in_chans=n["in_chans"], num_classes=n["num_classes"],
            embed_dim=cfg.dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.hidden / cfg.dim,
            qkv_bias=cfg.bias,
        )  # fmt: skip
        theirs.set_grad_checkpointing(checkpointing)
        ours = vit_from_timm(theirs)
        ours.trunk.cfg.activation_checkpointing = checkpointing  # the loader's config: a fresh object
        return Reference("timm VisionTransformer", theirs, ours, vit_loss, True)
    if w.task == "dit":
        from diffusers import DiTTransformer2DModel

        from models.loaders import dit_from_diffusers

        theirs = DiTTransformer2DModel(
            num_attention_heads=cfg.num_heads, attention_head_dim=cfg.dim // cfg.num_heads,
            in_channels=n["in_channels"], out_channels=n["in_channels"] * (2 if n["learn_sigma"] else 1),
            num_layers=cfg.depth, sample_size=n["input_size"], patch_size=n["patch_size"],
            num_embeds_ada_norm=n["num_classes"],
        )  # fmt: skip
        emb = theirs.transformer_blocks[0].norm1.emb.state_dict()
        for block in theirs.transformer_blocks[1:]:  # one embedder in every block, tied as in converted checkpoints
            block.norm1.emb.load_state_dict(emb)
        if checkpointing:
            theirs.enable_gradient_checkpointing()
        ours = dit_from_diffusers(theirs)
        ours.trunk.cfg.activation_checkpointing = checkpointing
        loss = dit_loss(lambda m, x, t, y: m(x, timestep=t, class_labels=y).sample)
        return Reference("diffusers DiTTransformer2DModel", theirs, ours, loss, True)
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return "skipped: transformers is not installed, so there is no LlamaForCausalLM to compare against"
    llama = LlamaConfig(
        vocab_size=n["vocab_size"], hidden_size=cfg.dim, intermediate_size=cfg.hidden, num_hidden_layers=cfg.depth,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads, max_position_embeddings=n["max_seq_len"],
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    theirs = LlamaForCausalLM(llama)
    if checkpointing:
        theirs.gradient_checkpointing_enable()
    # Llama has no QK-norm, so ours drops it for this comparison; there is no loader: weights differ.
    ours = build_ours(w, "pre", qk_norm=False, activation_checkpointing=checkpointing)
    return Reference(
        "transformers LlamaForCausalLM", theirs, ours, lm_loss(lambda m, ids: m(input_ids=ids).logits), False
    )


def reference_candidates(ref: Reference, w: Workload, batch: Batch, opts: Options) -> list[Candidate]:
    """``[theirs, ours]``; with shared weights the loss gap at init shows both compute the same function."""
    note = "independent init (no loader)"
    if ref.same_weights:
        ref.theirs.eval()
        ref.ours.eval()
        with torch.no_grad():
            gap = (OUR_LOSS[w.task](ref.ours, batch) - ref.loss(ref.theirs, batch)).abs()
        note = f"same weights: |loss ours - theirs| = {gap.item():.1e} at init"
    return [
        Candidate(ref.name, ref.theirs, ref.loss, batch, opts),
        Candidate(OURS, ref.ours, OUR_LOSS[w.task], batch, opts, note),
    ]


OURS = "ours (pre)"

#################################################################################
#                        Data loading vs consumption                            #
#################################################################################


def data_batches_per_s(w: Workload, batches: int, data_dir: str) -> float:
    """Batches/s of the text DataModule's training loader (embedded corpus) at the LM workload's shape."""
    from datamodules.text import TextDataModule

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


#################################################################################
#                        Report                                                 #
#################################################################################


def machine_info(device: torch.device) -> dict[str, str]:
    """What the numbers depend on: versions, device, threads, and how busy the machine was."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), "cpu")
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": f"{device.type}: {name}",
        "threads": f"{torch.get_num_threads()} intra-op of {os.cpu_count()} logical CPUs",
        "load average (1, 5, 15 min)": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


@dataclass(frozen=True)
class Target:
    """A performance goal checked against the measured rows."""

    what: str
    value: float
    limit: float
    at_most: bool = True

    @property
    def met(self) -> bool:
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        goal = f"{'<=' if self.at_most else '>='} {self.limit:g}"
        return f"- {'met   ' if self.met else 'MISSED'} {self.what}: {self.value:.3f} (target {goal})"


def targets(rows: Sequence[Row]) -> list[Target]:
    """The benchmark's goals, for whatever the rows cover."""
    out = []
    for r in rows:
        where = f"{r.task}/{r.size}"
        if r.group == "schemes" and r.task == "lm" and r.name == "siamese" and r.baseline == "pre":
            out.append(Target(f"{where} siamese/pre step time", r.step_ratio, 1.10))
            if _disagree(r):  # the saved-tensor count misses checkpointed inputs: the profiler's count stands
                out.append(Target(f"{where} siamese/pre activation memory (profiler)", r.alive_ratio, 1.15))
            else:
                out.append(Target(f"{where} siamese/pre activation memory", r.act_ratio, 1.15))
        elif r.group == "reference" and r.name == OURS:
            out.append(Target(f"{where} ours/{r.baseline} step time", r.step_ratio, 1.0))
        elif r.group == "data":
            out.append(Target(f"{where} data-loader batches/s over training batches/s", 1 / r.step_ratio, 5.0, False))
    return [t for t in out if not math.isnan(t.value)]


def _disagree(r: Row) -> bool:
    """The two activation-memory measures differ by more than 2% and 0.1 MB (NaN compares False)."""
    return abs(r.alive_mb / r.act_mb - 1) > 0.02 and abs(r.alive_mb - r.act_mb) > 0.1 if r.group != "data" else False


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if math.isnan(x) else f"{x:,.{digits}f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _table(head: Sequence[str], body: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table; the first column left-aligned, the numbers right-aligned, a trailing note left."""
    align = ["---"] + ["---:"] * (len(head) - 2) + ["---"]
    return [f"| {' | '.join(row)} |" for row in (head, align, *body)]


def markdown(rows: Sequence[Row], header: dict[str, str], notes: Sequence[str]) -> str:
    """The report: header, one table per (task, size, group), notes, and the targets met or missed."""
    lines = ["# Training-step benchmark", ""]
    lines += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    cuda = any(not math.isnan(r.peak_mb) for r in rows)
    cpu = any(not math.isnan(r.alive_mb) for r in rows)
    flops = any(not math.isnan(r.tflop) for r in rows)
    for (task, size, group), part in _groups(rows).items():
        if group == "data":
            lines += ["", f"## {task} / {size}: data loading vs training", ""]
            lines += _table(
                ["loader", "ms per batch", "batches/s", "data / training batches/s", "note"],
                [[r.name, _fmt(r.step_ms, 3), _fmt(r.throughput, 0), f"{_fmt(1 / r.step_ratio, 1)}x", r.note]
                 for r in part],
            )  # fmt: skip
            continue
        title = "norm schemes" if group == "schemes" else "ours vs reference at identical shapes"
        lines += ["", f"## {task} / {size}: {title} (ratios vs {part[0].baseline})", ""]
        head = ["name", "step ms", "p25-p75 ms", part[0].unit, "step ratio", "act MB", "act ratio",
                *(["alive MB", "alive ratio"] if cpu else []), "params", "param ratio",
                *(["peak step MB"] if cuda else []), *(["TFLOP/step", "MFU"] if flops else []), "note"]  # fmt: skip
        body = [
            [r.name, _fmt(r.step_ms, 1), f"{_fmt(r.step_ms_p25, 1)}-{_fmt(r.step_ms_p75, 1)}", _fmt(r.throughput, 0),
             _fmt(r.step_ratio, 3), _fmt(r.act_mb), _fmt(r.act_ratio, 3),
             *([_fmt(r.alive_mb), _fmt(r.alive_ratio, 3)] if cpu else []), f"{r.params:,}", _fmt(r.param_ratio, 4),
             *([_fmt(r.peak_mb)] if cuda else []), *([f"{r.tflop:.3g}", _pct(r.mfu)] if flops else []),
             r.note]
            for r in part
        ]  # fmt: skip
        lines += _table(head, body)
    notes = list(notes) + [
        f"{r.task}/{r.size} {r.name}: the saved-tensor count ({_fmt(r.act_mb)} MB) and the profiler's memory alive "
        f"after forward ({_fmt(r.alive_mb)} MB) disagree (> 2% and > 0.1 MB); with activation checkpointing the first "
        "misses block inputs held outside autograd (a NamedTuple state): read the alive columns"
        for r in rows
        if _disagree(r)
    ]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if goals := targets(rows):
        lines += ["", "## Targets", ""] + [g.line() for g in goals]
    return "\n".join(lines) + "\n"


def _groups(rows: Sequence[Row]) -> dict[tuple[str, str, str], list[Row]]:
    out: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        out.setdefault((r.task, r.size, r.group), []).append(r)
    return out


def write_report(out: Path, rows: Sequence[Row], header: dict[str, str], notes: Sequence[str]) -> str:
    """Writes ``bench.md`` and ``bench.csv`` into ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, header, notes)
    (out / "bench.md").write_text(text)
    with open(out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    return text


#################################################################################
#                        Command line                                           #
#################################################################################


def parse_schemes(text: str) -> list[str]:
    """``"all"`` or a comma list; repeats get ``#2``, ``#3`` so ``pre,pre`` measures noise."""
    names = [s.value for s in NormScheme] if text == "all" else [s.strip() for s in text.split(",") if s.strip()]
    valid = {s.value for s in NormScheme}
    for s in names:
        if s not in valid:
            raise SystemExit(f"error: unknown scheme {s!r}; valid: all, {', '.join(sorted(valid))}")
    seen: dict[str, int] = {}
    labels = []
    for s in names:
        seen[s] = seen.get(s, 0) + 1
        labels.append(s if seen[s] == 1 else f"{s}#{seen[s]}")
    return labels


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=[*TASKS, "all"], default="all")
    p.add_argument("--size", choices=list(SIZES), default="tiny")
    p.add_argument("--schemes", default="all", help="comma list of norm schemes, or 'all'")
    p.add_argument("--steps", type=int, default=15, help="measured rounds (each steps every candidate once)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    p.add_argument("--batch-size", type=int, default=None, help="override the size's batch")
    p.add_argument("--compile", action="store_true", help="torch.compile every network")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--no-reference", action="store_true", help="skip timm / diffusers / transformers")
    p.add_argument("--data-batches", type=int, default=200, help="batches timed from the text DataModule (0: skip)")
    p.add_argument("--data-dir", default="data/text", help="text DataModule shard cache")
    p.add_argument("--profile", action="store_true", help="also write torch.profiler op tables per scheme")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default 1: on a shared machine extra OpenMP threads stall at "
        "barriers and multiply step times; 0 keeps torch's default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default runs/bench/<task>-<size>)")
    return p


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


def bench_task(w: Workload, size: str, spec: RunSpec, opts: Options) -> tuple[list[Row], list[str]]:
    """Rows and notes for one workload: schemes interleaved, then the reference pair, then the data loader."""
    rows, notes = [], []
    batch = make_batch(w, opts.device, spec.seed)
    cands = []
    for label in spec.schemes:
        torch.manual_seed(spec.seed)  # same draws wherever two schemes share a structure
        with opts.device:  # built in place: no host-side init of large models
            model = build_ours(w, label.split("#")[0], activation_checkpointing=opts.checkpointing)
        cands.append(Candidate(label, model, OUR_LOSS[w.task], batch, opts))
    print(f"[{w.task}/{size}] {len(cands)} schemes x {spec.steps} rounds ...", flush=True)
    interleave(cands, spec.steps, spec.warmup)
    baseline = "pre" if "pre" in spec.schemes else spec.schemes[0]
    rows += summarize(cands, w, size, "schemes", baseline, spec.peak_tflops)
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
            rows += summarize(cands, w, size, "reference", ref.name, spec.peak_tflops)
            del cands
    if opts.device.type == "cuda":
        torch.cuda.empty_cache()
    if w.task == "lm" and spec.data_batches > 0:
        train = next(r for r in rows if r.group == "schemes" and r.name == baseline)
        rows.append(data_row(w, size, train, spec.data_batches, spec.data_dir))
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


def main(argv: Sequence[str] | None = None) -> list[Row]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        raise SystemExit("error: --steps must be >= 1 and --warmup >= 0")
    if args.threads and args.device == "cpu":
        torch.set_num_threads(args.threads)
    schemes = parse_schemes(args.schemes)
    tasks = list(TASKS) if args.task == "all" else [args.task]
    args.out = args.out or f"runs/bench/{args.task}-{args.size}"
    opts = Options(torch.device(args.device), args.bf16, args.compile, args.checkpointing)
    header = {"command": shlex.join(["python", "-m", "experiments.bench", *argv]), **machine_info(opts.device)}
    header["settings"] = (
        f"{args.steps} measured rounds after {args.warmup} warm-up rounds; bf16 {'on' if args.bf16 else 'off'}, "
        f"compile {'on' if args.compile else 'off'}, checkpointing {'on' if args.checkpointing else 'off'}; "
        "activation memory: saved-for-backward bytes of one forward (of the compiled graph under --compile)"
    )
    spec = RunSpec(
        schemes, args.steps, args.warmup, args.seed, not args.no_reference, args.data_batches, args.data_dir,
        Path(args.out) if args.profile else None,
    )  # fmt: skip
    rows, notes = [], []
    start = time.perf_counter()
    for task in tasks:
        w = SIZES[args.size][task]
        if args.batch_size:
            w = Workload(w.task, w.trunk, w.net, args.batch_size)
        task_rows, task_notes = bench_task(w, args.size, spec, opts)
        rows += task_rows
        notes += task_notes
    header["wall time"] = f"{time.perf_counter() - start:.0f} s"
    header["load average after (1, 5, 15 min)"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    text = write_report(Path(args.out), rows, header, notes)
    print(text)
    print(f"wrote {Path(args.out) / 'bench.md'} and {Path(args.out) / 'bench.csv'}")
    return rows


if __name__ == "__main__":
    main()
