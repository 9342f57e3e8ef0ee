"""The VAE a DiT export ships (``export --vae DIR``, else the run's ``vae_path``), checked before anything is written.

DIR/config.json   an AutoencoderKL config: its ``latent_channels`` must be the DiT's latent channels, or the
                  pipeline would sample latents its VAE cannot decode
"""

from __future__ import annotations

from pathlib import Path

from experiments.reliability.errors import SuiteError
from experiments.sharing.checkpoint import RunCheckpoint
from experiments.sharing.report import ExportOptions
from fileio import InputError, read_json

MAX_VAE_CONFIG_BYTES = 1 << 20  # an AutoencoderKL config.json is about 1 KB


def vae_directory(run: RunCheckpoint, options: ExportOptions) -> Path | None:
    """The VAE to ship: ``--vae``, else the run's ``vae_path`` (resolved from the current directory), else none.

    Raises:
        SuiteError: one line naming the directory and where it came from: it does not exist, holds no readable
            ``config.json``, or its ``latent_channels`` is not the DiT's.
    """
    path = options.vae or run.hparams.get("vae_path")
    if path is None:
        return None
    path = Path(path)
    where = f"--vae {path}" if options.vae else f"the run's vae_path {str(path)!r}"
    valid = "valid: --vae DIR of the AutoencoderKL the run's latents were encoded with, or run from the directory "
    valid += "the run was trained in"
    if not path.is_dir():
        raise SuiteError(f"{where} {'is not a directory' if path.exists() else 'does not exist'}; {valid}")
    if not (path / "config.json").is_file():
        raise SuiteError(f"{where} is not an AutoencoderKL directory (no config.json in it); {valid}")
    try:
        config = read_json(path / "config.json", "the VAE's config", dict, MAX_VAE_CONFIG_BYTES)
    except InputError as err:
        raise SuiteError(f"{where}: {err}; {valid}") from None
    theirs, ours = config.get("latent_channels", 4), run.hparams.get("latent_channels", 4)
    if isinstance(theirs, bool) or not isinstance(theirs, int):
        raise SuiteError(
            f"{where}: config.json's latent_channels is {theirs!r}, not a whole number; {valid} (its config.json "
            "as diffusers wrote it)"
        )
    if theirs != ours:
        raise SuiteError(
            f"{where}: its config.json says latent_channels {theirs} but the DiT of {run.path} samples "
            f"{ours}-channel latents, which it could not decode; {valid}"
        )
    return path
