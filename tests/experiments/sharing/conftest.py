"""Tiny runs to export: the task modules the CLI trains, with perturbed weights, saved as a fit saves them.

A run here is a run directory (``.suite-run`` marker, ``checkpoints/last.ckpt``, optionally ``summary.json``)
whose checkpoint holds what Lightning writes: the task's hyperparameters (config dataclasses as dicts, as
LightningCLI stores them), the DataModule's, and the module's state dict. Every parameter is moved off its
init (norm scales off 1, adaLN and DiT output layers off 0, the EMA copy off the trained weights), so a
round trip that dropped or mixed up a tensor would show in the outputs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.tasks import ImageClassification, LanguageModeling, LatentDiffusion, OptimConfig
from models import TrunkConfig

# The schemes every format is checked over: Pre-Norm, the two SiameseNorm forms, Hyper-Connections, and an MoE.
SCHEMES = ("pre", "siamese", "siamese_hybrid", "hyper", "moe")
TEXT_DATA = {"_class_path": "datamodules.text.TextDataModule", "source": "embedded", "tokenizer": "byte", "seq_len": 32}
IMAGE_DATA = {"_class_path": "datamodules.images.EmbeddedImageDataModule", "image_size": 16, "normalize": "imagenet"}
LATENT_DATA = {"_class_path": "datamodules.synthetic_latents.SyntheticLatentDataModule", "num_classes": 10}


def trunk(name: str, **fields: Any) -> TrunkConfig:
    """A 32-wide, 2-block, 2-head trunk under scheme ``name`` ("moe": Pre-Norm with 4 experts, top-2)."""
    moe = {"moe_experts": 4, "moe_top_k": 2} if name == "moe" else {}
    scheme = "pre" if name == "moe" else name
    return TrunkConfig(
        **{"dim": 32, "depth": 2, "num_heads": 2, "mlp_hidden": 64, "norm_scheme": scheme, **moe, **fields}
    )


@torch.no_grad()
def perturb(module: torch.nn.Module, seed: int) -> None:
    """Adds small noise to every parameter (EMA copies get their own draw)."""
    gen = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=gen))


def plain(value: Any) -> Any:
    """Config dataclasses as dicts, as LightningCLI saves hyperparameters."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def save_run(root: Path, name: str, module, class_path: str, data: dict, summary: dict | None = None) -> Path:
    """Writes ``root/runs/<task>/tiny/<name>`` as a fit would leave it; returns its ``last.ckpt``."""
    run = root / "runs" / module.task / "tiny" / name
    (run / "checkpoints").mkdir(parents=True)
    (run / ".suite-run").write_text(json.dumps({"made_by": "fit"}))
    hparams = {"_class_path": class_path, **{k: plain(v) for k, v in module.hparams.items()}}
    payload = {"hyper_parameters": hparams, "datamodule_hyper_parameters": data, "state_dict": module.state_dict()}
    torch.save({**payload, "global_step": 7, "epoch": 0}, run / "checkpoints" / "last.ckpt")
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run / "checkpoints" / "last.ckpt"


def lm_module(name: str, seed: int, vocab_size: int = 256) -> LanguageModeling:
    fields = {"mlp": "swiglu", "norm_layer": "rmsnorm", "bias": False, "qk_norm": name != "hyper"}
    module = LanguageModeling(trunk(name, **fields), OptimConfig(), vocab_size=vocab_size, seq_len=32, temperature=0.0)
    perturb(module, seed)
    return module.eval()


def vit_module(name: str, seed: int) -> ImageClassification:
    ema = 0.99 if name == "siamese" else None  # one run evaluates (and so exports) its EMA copy
    module = ImageClassification(trunk(name), OptimConfig(), num_classes=10, img_size=16, patch_size=4, ema_decay=ema)
    perturb(module, seed)
    return module.eval()


# (sampler, learned variance, guidance scale, guided channels, VAE) per scheme: the DiT protocol's variants
DIT_SETTINGS = {
    "pre": ("ddim", False, 1.0, None, False),
    "siamese": ("ddpm", True, 1.5, 3, True),
    "siamese_hybrid": ("ddpm", True, 2.0, None, False),
    "hyper": ("ddim", False, 1.0, None, True),
    "moe": ("ddim", False, 1.5, None, False),
}


def dit_module(name: str, seed: int, vae_path: Path) -> LatentDiffusion:
    sampler, learn_sigma, guidance, channels, vae = DIT_SETTINGS[name]
    module = LatentDiffusion(
        trunk(name, mlp="gelu_tanh", init="xavier"), OptimConfig(), num_classes=10, latent_size=8, latent_channels=4,
        vae_path=str(vae_path) if vae else None, learn_sigma=learn_sigma, sampler=sampler, sample_steps=4,
        guidance_scale=guidance, cfg_channels=channels, fid_samples=0, sample_grid_every_n_val=0,
    )  # fmt: skip
    perturb(module, seed)
    return module.eval()


@pytest.fixture(scope="package")
def tiny_vae(tmp_path_factory) -> Path:
    """An untrained 2-level AutoencoderKL (16 px <-> 4x8x8 latents) saved with ``save_pretrained``."""
    from models.vae import build_vae

    path = tmp_path_factory.mktemp("vae") / "vae"
    torch.manual_seed(0)
    build_vae((8, 8), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16).save_pretrained(path)
    return path
