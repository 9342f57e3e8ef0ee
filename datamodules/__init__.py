"""LightningDataModules and offline data readers for the LM, ViT and DiT tasks.

TextDataModule            causal-LM windows over the embedded corpus or user text/shards
EmbeddedImageDataModule   Fashion-MNIST (sklearn digits fallback) for ViT, VAE and DiT
ImageFolderDataModule     ImageNet-layout folders with the DeiT transform recipe
"""

import importlib

# Imported on first use (PEP 562), so `python -m datamodules.prepare_text` and the worker processes it starts
# do not load Lightning and torchvision just to tokenize text.
_WHERE = {
    "BPETokenizer": "datamodules.tokenizers",
    "ByteTokenizer": "datamodules.tokenizers",
    "Corpus": "datamodules.text_corpus",
    "EmbeddedImageDataModule": "datamodules.images",
    "ImageArrays": "datamodules.images",
    "ImageFolderDataModule": "datamodules.image_folder",
    "RandomWindowSampler": "datamodules.windows",
    "ShardMeta": "datamodules.shards",
    "SkipBrokenImages": "datamodules.image_folder",
    "TextDataModule": "datamodules.text",
    "TextTokenizer": "datamodules.tokenizers",
    "TokenWindows": "datamodules.windows",
    "UInt8ImageDataset": "datamodules.images",
    "build_tokenizer": "datamodules.tokenizers",
    "eval_window_starts": "datamodules.windows",
    "load_corpus": "datamodules.text_corpus",
    "load_embedded_corpus": "datamodules.text_corpus",
    "load_embedded_images": "datamodules.images",
    "load_tokenizer": "datamodules.tokenizers",
    "open_shard": "datamodules.shards",
    "read_idx_gz": "datamodules.images",
    "read_meta": "datamodules.shards",
    "read_text_path": "datamodules.text_corpus",
    "write_shards": "datamodules.shards",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'datamodules' has no attribute {name!r}")


__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Corpus",
    "EmbeddedImageDataModule",
    "ImageArrays",
    "ImageFolderDataModule",
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
