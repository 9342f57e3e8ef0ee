"""Images for the ViT task and the VAE: the embedded Fashion-MNIST (digits fallback) and ImageNet folders.

embedded.py   ``EmbeddedImageDataModule``: Fashion-MNIST from the Debian package, scikit-learn digits otherwise
folder.py     ``ImageFolderDataModule``: train/ and val/ class folders with the DeiT transform recipe
"""

from datamodules.images.embedded import EmbeddedImageDataModule
from datamodules.images.folder import ImageFolderDataModule

__all__ = ["EmbeddedImageDataModule", "ImageFolderDataModule"]
