"""Data for the three tasks: a package per modality, and the loading code they share.

    text/       LM: corpora, tokenizers, token shards, windows, ``TextDataModule``,
                ``python -m datamodules.text.prepare``
    images/     ViT and VAE: ``EmbeddedImageDataModule`` (Fashion-MNIST, digits fallback), ``ImageFolderDataModule``
    latents/    DiT: the VAE-latent cache, ``python -m datamodules.latents.encode``, ``LatentDataModule``, and
                ``SyntheticLatentDataModule`` for smoke runs
    samplers.py resumable training orders; loaders.py the one ``DataLoader`` recipe every DataModule uses
    fingerprint.py  the hash of the files a DataModule reads, compared across the ranks of a multi-process run

Belongs here: anything that reads, prepares or batches data. Never imports ``experiments``.
"""

import importlib
import importlib.abc
import sys

# Imported on first use (PEP 562), so `python -m datamodules.text.prepare` and the worker processes it starts
# do not load Lightning and torchvision just to tokenize text.
_WHERE = {
    "BPETokenizer": "datamodules.text.tokenizers",
    "ByteTokenizer": "datamodules.text.tokenizers",
    "Corpus": "datamodules.text.corpus",
    "EmbeddedImageDataModule": "datamodules.images.embedded",
    "ImageArrays": "datamodules.images.embedded",
    "ImageFolderDataModule": "datamodules.images.folder",
    "PermutedWindowSampler": "datamodules.text.windows",
    "RandomWindowSampler": "datamodules.text.windows",
    "ShardMeta": "datamodules.text.shards",
    "SkipBrokenImages": "datamodules.images.folder",
    "TextDataModule": "datamodules.text.datamodule",
    "TextTokenizer": "datamodules.text.tokenizers",
    "TokenWindows": "datamodules.text.windows",
    "UInt8ImageDataset": "datamodules.images.embedded",
    "build_tokenizer": "datamodules.text.tokenizers",
    "eval_window_starts": "datamodules.text.windows",
    "load_corpus": "datamodules.text.corpus",
    "load_embedded_corpus": "datamodules.text.corpus",
    "load_embedded_images": "datamodules.images.embedded",
    "load_tokenizer": "datamodules.text.tokenizers",
    "open_shard": "datamodules.text.shards",
    "read_idx_gz": "datamodules.images.embedded",
    "read_meta": "datamodules.text.shards",
    "read_text_path": "datamodules.text.corpus",
    "write_shards": "datamodules.text.shards",
}


# Modules of the flat layout before the package per modality: importing one (a config's class_path, an old
# ``python -m``) fails with a pointer to where it went instead of a bare "No module named".
MOVED = {
    "datamodules.text_corpus": "datamodules.text.corpus",
    "datamodules.tokenizers": "datamodules.text.tokenizers",
    "datamodules.shards": "datamodules.text.shards",
    "datamodules.text_pipeline": "datamodules.text.pipeline",
    "datamodules.windows": "datamodules.text.windows",
    "datamodules.shard_windows": "datamodules.text.shard_windows",
    "datamodules.prepare_text": "datamodules.text.prepare",
    "datamodules.image_folder": "datamodules.images.folder",
    "datamodules.encode_latents": "datamodules.latents.encode",
    "datamodules.synthetic_latents": "datamodules.latents.synthetic",
}


class _MovedModules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} moved to {MOVED[fullname]}", name=fullname)
        return None


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())  # last: only names no other finder knows reach it


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if f"datamodules.{name}" in MOVED:  # a class_path of the old layout: say where the module went
        raise AttributeError(f"datamodules.{name} moved to {MOVED[f'datamodules.{name}']}")
    raise AttributeError(f"module 'datamodules' has no attribute {name!r}")


__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Corpus",
    "EmbeddedImageDataModule",
    "ImageArrays",
    "ImageFolderDataModule",
    "PermutedWindowSampler",
    "RandomWindowSampler",
    "ShardMeta",
    "SkipBrokenImages",
    "TextDataModule",
    "TextTokenizer",
    "TokenWindows",
    "UInt8ImageDataset",
    "build_tokenizer",
    "eval_window_starts",
    "load_corpus",
    "load_embedded_corpus",
    "load_embedded_images",
    "load_tokenizer",
    "open_shard",
    "read_idx_gz",
    "read_meta",
    "read_text_path",
    "write_shards",
]
