"""The latent autoencoder as a network: build a fresh diffusers ``AutoencoderKL``, or load a saved one.

Plain PyTorch + diffusers (no Lightning), so the latent cache (:mod:`datamodules.latents.encode`), the
DiT task (decoding samples) and the VAE task (:mod:`experiments.tasks.vae`, which trains one) share it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from diffusers import AutoencoderKL

__all__ = ["build_vae", "load_vae"]


def build_vae(
    block_out_channels: Sequence[int],
    layers_per_block: int,
    latent_channels: int,
    norm_num_groups: int,
    in_channels: int = 3,
    sample_size: int = 32,
) -> AutoencoderKL:
    """A fresh ``AutoencoderKL``; each block after the first halves the side (3 blocks: 32 px -> 8x8)."""
    if any(c % norm_num_groups for c in block_out_channels):
        raise ValueError(f"block_out_channels={list(block_out_channels)} must be multiples of {norm_num_groups=}")
    n = len(block_out_channels)
    return AutoencoderKL(
        in_channels=in_channels,
        out_channels=in_channels,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(block_out_channels),
        layers_per_block=layers_per_block,
        latent_channels=latent_channels,
        norm_num_groups=norm_num_groups,
        sample_size=sample_size,
    )


def load_vae(path: str) -> AutoencoderKL:
    """Loads a ``save_pretrained`` AutoencoderKL directory (ours, or a local ``sd-vae-ft-ema``); never downloads.

    Raises:
        ValueError: One line naming the path when it is missing or holds no AutoencoderKL.
    """
    directory = Path(path)
    config = directory / "config.json"
    if not directory.is_dir():
        raise ValueError(f"VAE directory {str(directory)!r} does not exist (train one: configs/vae/tiny.yaml)")
    if not config.is_file():
        raise ValueError(f"{str(directory)!r} is not a diffusers model directory: no config.json")
    try:
        class_name = json.loads(config.read_text()).get("_class_name")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{str(config)!r} is not a valid diffusers config: {err}") from None
    if class_name != "AutoencoderKL":
        raise ValueError(f"{str(directory)!r} holds a {class_name!r}, not an AutoencoderKL")
    try:
        return AutoencoderKL.from_pretrained(str(directory), local_files_only=True, low_cpu_mem_usage=False)
    except (OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"could not load the AutoencoderKL in {str(directory)!r}: {first_line}") from None
