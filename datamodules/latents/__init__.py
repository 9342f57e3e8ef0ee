"""VAE latents for the DiT task: the cache on disk, the command that fills it, and the DataModules.

cache.py        the cache format: ``meta.json``, latent shards, their writer and reader
encode.py       ``python -m datamodules.latents.encode``: a VAE encodes an image set once, resumably
datamodule.py   ``LatentDataModule``: batches from a cache
synthetic.py    ``SyntheticLatentDataModule``: latents made up from a seed, for smoke runs with no VAE
"""

import importlib

# Imported on first use (PEP 562), so reading a cache's metadata does not load Lightning.
_WHERE = {
    "LatentDataModule": "datamodules.latents.datamodule",
    "SyntheticLatentDataModule": "datamodules.latents.synthetic",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'datamodules.latents' has no attribute {name!r}")


__all__ = ["LatentDataModule", "SyntheticLatentDataModule"]
