"""LightningDataModules and offline data readers for the LM, ViT and DiT tasks.

TextDataModule            causal-LM windows over the embedded corpus or user text/shards
EmbeddedImageDataModule   Fashion-MNIST (sklearn digits fallback) for ViT, VAE and DiT
ImageFolderDataModule     ImageNet-layout folders with the DeiT transform recipe
"""

from datamodules.image_folder import ImageFolderDataModule, SkipBrokenImages
from datamodules.images import (
    EmbeddedImageDataModule,
    ImageArrays,
    UInt8ImageDataset,
    load_embedded_images,
    read_idx_gz,
)
from datamodules.shards import ShardMeta, open_shard, read_meta, write_shards
from datamodules.text import TextDataModule
from datamodules.text_corpus import Corpus, load_corpus, load_embedded_corpus, read_text_path
from datamodules.tokenizers import BPETokenizer, ByteTokenizer, TextTokenizer, build_tokenizer, load_tokenizer
from datamodules.windows import RandomWindowSampler, TokenWindows, eval_window_starts

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
