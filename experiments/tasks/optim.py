"""AdamW with the usual no-decay groups, and linear warmup + cosine decay (stepped per update)."""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

import math
from dataclasses import dataclass
from typing import Annotated

import torch
from annotated_types import Ge, Gt, Interval
from torch import nn

from models.norms import POINTWISE


@dataclass
class OptimConfig:
    """Optimizer and schedule of every task.

    Attributes:
        lr: peak learning rate.
        weight_decay: AdamW decay on matrices; norm scales, biases, embeddings and scalars get none.
        betas: AdamW betas.
        eps: AdamW epsilon.
        warmup_steps: linear warmup length in optimizer steps.
        warmup_epochs: alternative warmup length in epochs (converted with the trainer's steps per epoch).
        schedule: "cosine" (to ``min_lr_ratio * lr``) or "constant" after warmup.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        fused: fused AdamW kernel; None picks it on CUDA.
    """

    lr: Annotated[float, Gt(0)] = 1e-3
    weight_decay: Annotated[float, Ge(0)] = 0.1
    betas: tuple[Annotated[float, Interval(ge=0, lt=1)], Annotated[float, Interval(ge=0, lt=1)]] = (0.9, 0.95)
    eps: Annotated[float, Gt(0)] = 1e-8
    warmup_steps: Annotated[int, Ge(0)] = 0
    warmup_epochs: Annotated[float, Ge(0)] = 0.0
    schedule: str = "cosine"
    min_lr_ratio: Annotated[float, Interval(ge=0, le=1)] = 0.1
    fused: bool | None = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.warmup_steps < 0 or self.warmup_epochs < 0:
            raise ValueError(f"warmup must be >= 0, got steps={self.warmup_steps} epochs={self.warmup_epochs}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"unknown optim.schedule {self.schedule!r}; valid: cosine, constant")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay only the weight matrices of Linear / conv layers; no decay for norms (DyT / Derf included), biases,
    embeddings, tokens and scalars, chosen by each parameter's role, not its shape alone: under FSDP2 the packed
    qkv projection's bias is 2-D (``experiments.parallel.packed``) and is still a bias, so DDP and FSDP2 decay the
    same set."""
    no_decay_modules = (nn.LayerNorm, nn.RMSNorm, nn.Embedding, *POINTWISE)
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            no_decay_role = name in ("bias", "cls_token", "pos_embed")
            if isinstance(module, no_decay_modules) or p.ndim < 2 or no_decay_role:
                no_decay.append(p)
            else:
                decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float, schedule: str = "cosine") -> float:
    """LR multiplier: linear warmup from ~0 to 1 over ``warmup`` steps, then cosine to ``min_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, cfg: OptimConfig, total_steps: int, steps_per_epoch: float) -> dict:
    """The ``configure_optimizers`` dict: AdamW and a per-step LambdaLR."""
    fused = cfg.fused if cfg.fused is not None else torch.cuda.is_available()
    opt = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused or None
    )
    warmup = cfg.warmup_steps + round(cfg.warmup_epochs * steps_per_epoch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warmup_cosine(s, warmup, total_steps, cfg.min_lr_ratio, cfg.schedule)
    )
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "train/lr"}}
