"""How fast a run trains: tokens/s, samples/s, model FLOP utilization and peak memory, in TensorBoard and
``summary.json`` (``perf``), for every task and every run.

    train/samples_per_s     training samples (sequences, images, latents) per second, all ranks together
    train/tokens_per_s      tokens through the trunk per second (sequence length; ViT patches + cls; DiT patches)
    train/mfu               model FLOP utilization: achieved model FLOP/s over the devices' peak (GPUs only)
    train/mfu_causal        the same with the causal-halved attention count (LM only: what a causal kernel does)
    train/peak_mem_gb       peak memory: CUDA's max allocated on a GPU, else the process's peak resident set

Under ``train/``: TensorBoard's TIME SERIES opens its first two groups by name, which stay ``train`` and ``val``.

Each logging interval (``log_every_n_steps``) is timed as a whole, on the host clock, without a device
synchronize (the loss logged every step already waits for the device), so no step pays a host sync for it. The
first interval of a fit (start-up, compilation) is not counted in the run's average.

The FLOP convention (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B): one training token costs
``6 N + 12 L d T`` FLOPs, ``N`` the parameters a token multiplies by (every parameter but the input embedding and
position tables; an MoE counts its experts at ``top_k / E``), ``L`` blocks, ``d`` the width, ``T`` the tokens a
sample attends over. ``12 L d T`` counts attention's two matmuls over the full ``T x T`` score matrix forward and
backward; a causal kernel skips half of it (``6 L d T``): both are reported for the LM, the full count for the
bidirectional ViT and DiT. Peak FLOP/s are the dense bfloat16 tensor-core numbers of the device's datasheet
(:data:`PEAK_BF16`; sparsity doubles them, and is not counted); on a CPU, or a GPU not listed, MFU is not reported.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from experiments.monitoring.diagnostics import find_trunk

#: dense bfloat16 peak FLOP/s per device name, from NVIDIA's datasheets (the sparse figures are twice these), in
#: the order names are matched (a name's first entry contained in it wins: "A100" before "A10", "L40S" before "L4")
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),  # GH200 too
    ("H100 PCIE", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
)
_EMBEDDING_NAMES = ("embed", "pos_embed", "cls_token", "table")  # LM token table; ViT's; DiT's label table


def peak_flops_of(name: str) -> float | None:
    """The dense bfloat16 peak FLOP/s of a GPU named ``name`` (:data:`PEAK_BF16`), None when it is not listed."""
    upper = name.upper()
    return next((flops for key, flops in PEAK_BF16 if key in upper), None)


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bfloat16 peak FLOP/s, None on a CPU or an unlisted GPU."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def flop_parameters(net: nn.Module) -> int:
    """``N``: the parameters a token multiplies by: every parameter but embedding tables (a lookup, not a matmul;
    a tied output head is counted once, as the head); an MoE's experts count at ``top_k / E``."""
    trunk = find_trunk(net)
    cfg = getattr(trunk, "cfg", None)
    experts, top_k = getattr(cfg, "moe_experts", 0) or 0, getattr(cfg, "moe_top_k", 1) or 1
    head = getattr(net, "head", None)
    tied = head is not None and getattr(head, "weight", None) is getattr(getattr(net, "embed", None), "weight", 0)
    total = 0.0
    for name, p in net.named_parameters():
        leaf = name.split(".")
        if any(part in _EMBEDDING_NAMES for part in leaf) and not (tied and leaf[0] == "embed"):
            continue
        total += p.numel() * (top_k / experts if experts and ".experts." in f".{name}." else 1.0)
    return int(total)


def flops_per_token(n: int, depth: int, dim: int, tokens: int, causal: bool) -> float:
    """Training FLOPs of one token: ``6 N + 12 L d T`` (``6 L d T`` with ``causal``: half the score matrix)."""
    return 6 * n + (6 if causal else 12) * depth * dim * tokens


def peak_memory_gb(device: torch.device) -> float:
    """CUDA's peak allocated memory on a GPU, else this process's peak resident set (GB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak * (1 if sys.platform == "darwin" else 1024) / 1e9


class Throughput(Callback):
    """Logs the speed tags every ``log_every_n_steps`` and keeps the run's averages for ``summary.json`` (module
    docstring). Added by every task."""

    def __init__(self) -> None:
        self.tokens: int | None = None  # tokens per sample, read from the trunk's first forward
        self._interval_start: float | None = None
        self._interval_steps = 0
        self._samples = 0
        self._counted: dict[str, float] = {"seconds": 0.0, "samples": 0.0}
        self._first_interval = True
        self.last: dict[str, float] = {}

    def _capture_tokens(self, trunk: nn.Module) -> None:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            self.tokens = int(x.shape[-2])  # (B, N, D)
            handle.remove()

        handle = trunk.register_forward_pre_hook(hook, with_kwargs=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trunk = find_trunk(pl_module)
        if trunk is not None and self.tokens is None:
            self._capture_tokens(trunk)
        self._interval_start, self._first_interval = time.perf_counter(), True
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._samples += _batch_size(batch)
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # an optimizer step is still to come
        self._interval_steps += 1
        if trainer.global_step % max(1, trainer.log_every_n_steps) or self._interval_start is None:
            return
        now = time.perf_counter()
        seconds, samples = now - self._interval_start, self._samples * _replicas(trainer)
        self._interval_start, self._interval_steps, self._samples = now, 0, 0
        if seconds <= 0 or samples == 0:
            return
        metrics = self.rates(pl_module, samples / seconds, trainer.world_size)
        if not self._first_interval:  # start-up and compilation stay out of the run's average
            self._counted["seconds"] += seconds
            self._counted["samples"] += samples
        self._first_interval = False
        self.last = metrics
        pl_module.log_dict(metrics, rank_zero_only=True)

    def rates(self, pl_module: L.LightningModule, samples_per_s: float, world_size: int) -> dict[str, float]:
        """The speed tags for ``samples_per_s`` of this module over ``world_size`` devices."""
        metrics = {"train/samples_per_s": samples_per_s, "train/peak_mem_gb": peak_memory_gb(pl_module.device)}
        if self.tokens is None:
            return metrics
        tokens_per_s = samples_per_s * self.tokens
        metrics["train/tokens_per_s"] = tokens_per_s
        peak = peak_flops(pl_module.device)
        trunk = find_trunk(pl_module)
        if peak is None or trunk is None:
            return metrics
        n, cfg = flop_parameters(pl_module.net), trunk.cfg
        full = flops_per_token(n, cfg.depth, cfg.dim, self.tokens, causal=False)
        metrics["train/mfu"] = tokens_per_s * full / (peak * world_size)
        if getattr(pl_module, "task", None) == "lm":
            causal = flops_per_token(n, cfg.depth, cfg.dim, self.tokens, causal=True)
            metrics["train/mfu_causal"] = tokens_per_s * causal / (peak * world_size)
        return metrics

    def record(self, pl_module: L.LightningModule, world_size: int) -> dict[str, Any]:
        """The run's ``perf`` entry: averages over every interval after the first, the FLOP convention, the peak."""
        seconds, samples = self._counted["seconds"], self._counted["samples"]
        rates = self.rates(pl_module, samples / seconds, world_size) if seconds > 0 else dict(self.last)
        peak = peak_flops(pl_module.device)
        trunk = find_trunk(pl_module)
        entry: dict[str, Any] = {k.removeprefix("train/"): v for k, v in rates.items() if math.isfinite(v)}
        entry["mfu"] = entry.get("mfu", "n/a")
        entry.update(
            {
                "devices": world_size,
                "device": torch.cuda.get_device_name(pl_module.device) if pl_module.device.type == "cuda" else "cpu",
                "peak_flops_per_device": peak if peak is not None else "n/a",
                "tokens_per_sample": self.tokens,
                "flop_parameters": flop_parameters(pl_module.net) if trunk is not None else None,
                "flop_convention": "6N + 12LdT per token (attention full; mfu_causal: 6N + 6LdT)",
            }
        )
        return entry


def _batch_size(batch: Any) -> int:
    """Samples in a training batch: the first dimension of its first tensor (token windows, images, latents)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0


def _replicas(trainer: L.Trainer) -> int:
    """Data-parallel replicas: each reads its own batch (tensor-parallel ranks of one replica share one)."""
    mesh = getattr(trainer.strategy, "device_mesh", None)
    if mesh is not None and "data_parallel" in (mesh.mesh_dim_names or ()):
        return mesh["data_parallel"].size()
    return trainer.world_size
