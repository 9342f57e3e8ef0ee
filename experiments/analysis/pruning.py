"""Layer-pruning sensitivity: the validation loss with every block, then with each block skipped in turn."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from experiments.analysis.loading import AnalysisError
from experiments.monitoring.diagnostics import find_trunk


def batch_loss(module: L.LightningModule, batch, skip: frozenset[int]) -> tuple[Tensor, int]:
    """The task's validation loss on one batch with ``skip`` blocks skipped, and its weight."""
    if module.task == "lm":
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, N) each
        logits = module.net(inputs, skip_blocks=skip)  # (B, N, V)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()), targets.numel()
    if module.task == "vit":
        images, labels = batch
        return F.cross_entropy(module._eval_net()(images, skip_blocks=skip), labels), len(labels)
    if module.task == "dit":
        latents, labels = batch
        ema = module.ema.module
        gen = torch.Generator(device=latents.device).manual_seed(1000 + int(labels[0]))  # as in model_step
        net = lambda x, t, y: ema(x, t, y, skip_blocks=skip)  # noqa: E731
        return module.diffusion_loss(net, latents, labels, generator=gen), len(labels)
    raise AnalysisError(f"no validation loss for task {module.task!r}")


@torch.no_grad()
def mean_loss(module: L.LightningModule, batches: list, skip: frozenset[int] = frozenset()) -> float:
    """Weighted mean validation loss over ``batches`` (weights as the task's own val metric)."""
    total, weight = 0.0, 0
    for batch in batches:
        loss, n = batch_loss(module, batch, skip)
        total, weight = total + float(loss) * n, weight + n
    return total / weight


def pruning_table(module: L.LightningModule, batches: list) -> list[dict]:
    """A baseline row, then one row per block: the loss with that block skipped and the increase."""
    depth = len(find_trunk(module).blocks)
    base = mean_loss(module, batches)
    rows = [{"skipped": "none", "loss": base, "increase": 0.0, "relative": 0.0}]
    for b in range(depth):
        loss = mean_loss(module, batches, frozenset({b}))
        rows.append({"skipped": f"block_{b}", "loss": loss, "increase": loss - base, "relative": (loss - base) / base})
    return rows


def plot_pruning(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = rows[1:]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 + 0.45 * len(blocks)), 4))
    ax.bar([r["skipped"].removeprefix("block_") for r in blocks], [r["increase"] for r in blocks], color="#4a7ab5")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("skipped block")
    ax.set_ylabel("validation loss increase")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
