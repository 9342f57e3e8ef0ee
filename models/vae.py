"""The latent autoencoder as a network: build a fresh diffusers ``AutoencoderKL``, or load a saved one.

Plain PyTorch + diffusers (no Lightning), so the latent cache (:mod:`datamodules.latents.encode`), the
DiT task (decoding samples) and the VAE task (:mod:`experiments.tasks.vae`, which trains one) share it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from pathlib import Path

from diffusers import AutoencoderKL

from fileio import InputError, read_json

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


def _json_kind(default: object) -> tuple[tuple[type, ...], str] | None:
    """The JSON types a config value may take, judged from the constructor's default (None: any)."""
    if isinstance(default, bool):
        return (bool,), "true or false"
    if isinstance(default, int):
        return (int,), "an integer"
    if isinstance(default, float):
        return (int, float), "a number"
    if isinstance(default, str):
        return (str,), "a string"
    if isinstance(default, tuple | list) and default:
        return (list,), f"a list of {'strings' if isinstance(default[0], str) else 'numbers'}"
    return None


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_vae_config(config: dict, path: Path) -> None:
    """Refuses (in one line) a config.json value whose JSON type the AutoencoderKL constructor cannot take:
    ``"block_out_channels": "abc"`` would otherwise fail deep inside diffusers. Every number the constructor
    takes (channels, layers, groups, sizes, the scaling factor) must be positive and finite.

    Raises:
        ValueError: naming the file, the key, the value and the expected type.
    """
    for name, parameter in inspect.signature(AutoencoderKL.__init__).parameters.items():
        kind = _json_kind(parameter.default)
        if name not in config or kind is None:
            continue
        types, valid = kind
        value = config[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            ok = False
        elif isinstance(value, list):  # tuples in Python, lists in JSON
            strings = "strings" in valid
            ok = bool(value) and all(isinstance(v, str) if strings else _positive(v) for v in value)
        else:
            ok = isinstance(value, bool | str) or _positive(value)
        if not ok:
            valid += "" if "string" in valid or "true" in valid else ", positive"
            raise ValueError(f"{str(path)!r}: {name}={repr(value)[:60]}; valid: {valid}")


def load_vae(path: str) -> AutoencoderKL:
    """Loads a ``save_pretrained`` AutoencoderKL directory (ours, or a local ``sd-vae-ft-ema``); never downloads.

    ``config.json`` is read as JSON (any shape refused in one line) and its values checked against the
    constructor's types before diffusers builds anything (:func:`check_vae_config`).

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
        values = read_json(config, "VAE config", dict)
    except InputError as err:  # not JSON, an array, nested too deep, huge
        raise ValueError(f"{str(config)!r} is not a valid diffusers config: {err}") from None
    class_name = values.get("_class_name")
    if class_name != "AutoencoderKL":
        raise ValueError(f"{str(directory)!r} holds a {class_name!r}, not an AutoencoderKL")
    check_vae_config(values, config)
    try:
        return AutoencoderKL.from_pretrained(str(directory), local_files_only=True, low_cpu_mem_usage=False)
    except (OSError, ValueError, TypeError, KeyError, IndexError, RuntimeError) as err:  # what a config or
        # weights file that passed the checks above can still trip on (e.g. weights of another shape)
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"could not load the AutoencoderKL in {str(directory)!r}: {first_line[:200]}") from None
