"""The benchmark's workloads: each task (LM, MoE LM, ViT classifier, DiT) at each size as plain data (``SIZES``),
our network for a workload under a norm scheme (``build_ours``), a fixed random batch of its shape
(``make_batch``) and the training loss of each task, written against a forward adapter so reference networks
reuse it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import DiT, LanguageModel, TrunkConfig, ViTClassifier
from models.presets import PRESETS

Task = Literal["lm", "moe", "vit", "dit"]
TASKS: tuple[Task, ...] = ("lm", "vit", "dit")  # what ``--task all`` runs
LM_TASKS: tuple[Task, ...] = ("lm", "moe")  # token workloads: a LanguageModel, dense or mixture of experts
MOE_AUX_WEIGHT = (
    0.04  # the load-balancing loss (mean over MoE layers) in the training loss, as configs/lm/moe-tiny.yaml
)
Batch = tuple[Tensor, ...]
LossFn = Callable[[nn.Module, Batch], Tensor]

#################################################################################
#                        Workloads: task x size, as data                        #
#################################################################################


@dataclass(frozen=True)
class Workload:
    """One task at one size: the trunk, the network around it and the batch.

    Attributes:
        task: "lm" or "moe" (tokens/s), "vit" or "dit" (images/s).
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
        return "tokens" if self.task in LM_TASKS else "images"

    @property
    def units_per_step(self) -> int:
        return self.batch_size * (self.net["max_seq_len"] if self.task in LM_TASKS else 1)


def lm_workload(batch: int, seq: int, **trunk) -> Workload:
    """An LM workload in the presets' flavour (SwiGLU, RMSNorm, QK-norm, no biases), byte vocabulary."""
    return Workload("lm", {**PRESETS["lm-tiny"].trunk, **trunk}, dict(vocab_size=256, max_seq_len=seq), batch)


def moe_workload(batch: int, seq: int, **trunk) -> Workload:
    """:func:`lm_workload` with the MLPs made a token-choice mixture of experts (``moe_*`` in ``trunk``)."""
    lm = lm_workload(batch, seq, **trunk)
    return Workload("moe", lm.trunk, lm.net, batch)


def _vit(batch: int, img: int, patch: int, classes: int, **trunk) -> Workload:
    net = dict(img_size=img, patch_size=patch, in_chans=3, num_classes=classes)
    return Workload("vit", {**PRESETS["vit-tiny"].trunk, **trunk}, net, batch)


def _dit(batch: int, latent: int, patch: int, classes: int, **trunk) -> Workload:
    net = dict(input_size=latent, patch_size=patch, in_channels=4, num_classes=classes, learn_sigma=False)
    return Workload("dit", {**PRESETS["dit-tiny"].trunk, **trunk}, net, batch)


# fmt: off
SIZES: dict[str, dict[Task, Workload]] = {
    # micro: seconds, for tests
    "micro": {"lm": lm_workload(4, 32, dim=32, depth=2, num_heads=2, mlp_hidden=64),
              "moe": moe_workload(4, 32, dim=32, depth=2, num_heads=2, mlp_hidden=64, moe_experts=4, moe_top_k=2,
                                  moe_hidden=32),
              "vit": _vit(8, 16, 4, 10, dim=32, depth=2, num_heads=2),
              "dit": _dit(8, 4, 2, 10, dim=32, depth=2, num_heads=2)},
    # tiny: the shipped configs/{lm,vit,dit}/tiny.yaml models and batches (moe: + configs/lm/moe-tiny.yaml)
    "tiny":  {"lm": lm_workload(32, 128, dim=128, depth=4, num_heads=4, mlp_hidden=512),
              "moe": moe_workload(32, 128, dim=128, depth=4, num_heads=4, mlp_hidden=512, moe_experts=8, moe_top_k=2,
                                  moe_hidden=256),
              "vit": _vit(128, 28, 7, 10, dim=128, depth=4, num_heads=4),
              "dit": _dit(128, 8, 2, 10, dim=128, depth=4, num_heads=4)},
    # small: LM d256 x 6; the same LM with OLMoE's routing (64 experts, top-8) and experts of 1/8 the dense MLP's
    # hidden size, so a token's active MLP equals the dense LM's; DeiT-T at 64 px; DiT-S/2 at 16x16 latents
    "small": {"lm": lm_workload(16, 256, dim=256, depth=6, num_heads=4, mlp_hidden=1024),
              "moe": moe_workload(16, 256, dim=256, depth=6, num_heads=4, mlp_hidden=1024, moe_experts=64, moe_top_k=8,
                                  moe_hidden=128),
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
    if w.task in LM_TASKS:
        return LanguageModel(cfg, **w.net)
    if w.task == "vit":
        return ViTClassifier(cfg, **w.net)
    return DiT(cfg, **w.net)


def make_batch(w: Workload, device: torch.device, seed: int = 0) -> Batch:
    """A fixed random batch of the workload's shape (the model does the same work on any values)."""
    g = torch.Generator().manual_seed(seed)
    b, n = w.batch_size, w.net
    if w.task in LM_TASKS:
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


def moe_loss(model: nn.Module, batch: Batch) -> Tensor:
    """Next-token cross-entropy plus the weighted load-balancing loss: what an MoE LM trains on."""
    logits, routing = model(batch[0][:, :-1], return_aux=True)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[0][:, 1:].flatten()) + MOE_AUX_WEIGHT * routing.mean_loss


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
    "moe": moe_loss,
    "vit": vit_loss,
    "dit": dit_loss(lambda m, x, t, y: m(x, t, y)),
}
