"""ImageFolderDataModule: ImageNet-layout folders with the DeiT transform recipe from timm.

    root/
      train/<class>/*.JPEG     training images, one directory per class
      val/<class>/*.JPEG       validation images, same class directory names

Train transform (DeiT, Touvron et al. 2021): RandomResizedCrop + flip + RandAugment
(`rand-m9-mstd0.5-inc1`) + random erasing (p=0.25, per-pixel noise); eval: resize to
image_size / crop_pct, center crop, normalize. Mixup/CutMix act on whole batches and belong to
the training step (timm.data.Mixup), not here.

A file that fails to decode does not stop a multi-day run: `SkipBrokenImages` returns the next
readable sample instead, warns with the path, and counts the skip in shared memory so the
total over all workers is visible (`num_broken_images`).
"""

# Annotations are evaluated (no ``from __future__ import annotations``): jsonargparse checks the
# ``Annotated`` bounds while parsing only then.

import os
import warnings
from pathlib import Path
from typing import Annotated

import lightning as L
import torch
from annotated_types import Ge, Interval
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from PIL import Image
from timm.data import create_transform
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from datamodules.batching import data_parallel_replicas
from datamodules.fingerprint import check_same_items
from datamodules.loaders import make_loader
from datamodules.samplers import RandomPermutationSampler, RepeatedAugmentationSampler

INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming", "random")
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


class SkipBrokenImages(Dataset[tuple[torch.Tensor, int]]):
    """Wraps an ImageFolder so an unreadable file yields the next readable sample instead of a crash.

    Args:
        dataset: The folder dataset.
        max_consecutive: Give up (raise) after this many unreadable files in a row.
    """

    def __init__(self, dataset: ImageFolder, max_consecutive: int = 32) -> None:
        self.dataset = dataset
        self.max_consecutive = max_consecutive
        self.broken = torch.zeros(1, dtype=torch.int64).share_memory_()  # shared with worker processes

    @property
    def num_broken(self) -> int:
        """Unreadable-file encounters so far, summed over all worker processes."""
        return int(self.broken.item())

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for step in range(self.max_consecutive):
            path, target = self.dataset.samples[(index + step) % len(self.dataset)]
            try:
                image = self.dataset.loader(path)  # decodes fully (convert("RGB")), so errors surface here
            except _DECODE_ERRORS as err:
                self.broken += 1  # in place: the count lives in shared memory
                warnings.warn(
                    f"skipped unreadable image {path} ({err}); {self.num_broken} skipped so far", stacklevel=2
                )
                continue
            if self.dataset.transform is not None:
                image = self.dataset.transform(image)  # outside the try: a transform bug must still raise
            return image, target
        raise ValueError(
            f"{self.max_consecutive} unreadable images in a row from index {index} of {self.dataset.root}; "
            "valid: decodable image files (these may be truncated or not images)"
        )

    def check_decodable(self) -> None:
        """Decodes files from the start until one works; a one-line ValueError when none of the first
        ``max_consecutive`` does (a folder of truncated files fails at setup, not deep in a worker)."""
        last: tuple[str, BaseException] | None = None
        for path, _ in self.dataset.samples[: self.max_consecutive]:
            try:
                self.dataset.loader(path)
                return
            except _DECODE_ERRORS as err:
                last = (path, err)
        if last is not None:
            raise ValueError(
                f"{self.dataset.root}: none of the first {self.max_consecutive} images can be decoded (e.g. "
                f"{last[0]}: {str(last[1]).splitlines()[0] if str(last[1]) else type(last[1]).__name__}); "
                "valid: decodable image files"
            )


class _ClassFolder(ImageFolder):
    """An ImageFolder whose class list is given (val must use train's labels, even if a class is absent)."""

    def __init__(self, root: Path, classes: list[str], transform: torch.nn.Module) -> None:
        self._given_classes = classes
        super().__init__(str(root), transform=transform, allow_empty=True)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        return self._given_classes, {name: i for i, name in enumerate(self._given_classes)}


DEFAULT_BATCH_SIZE = 128


class ImageFolderDataModule(L.LightningDataModule):
    """ImageNet-style classification data with DeiT train and eval transforms.

    The test split is the val split: ImageNet publishes no test labels, so `test` reports the
    same images as `validate` (the standard "ImageNet val top-1").

    Args:
        root: Directory holding train/ and val/ class directories.
        image_size: Crop side in pixels.
        batch_size: Images per batch on each device (default 128 when neither this nor
            ``global_batch_size`` is set).
        global_batch_size: Images per optimizer step over all devices (the number a recipe states, e.g.
            DeiT's 1024), split into a per-device batch of global / (data-parallel replicas x
            accumulate_grad_batches), which must divide evenly (under tensor parallelism the ranks of one replica
            read the same batch). Set one of the two, not both.
        num_workers: DataLoader worker processes (JPEG decoding is the bottleneck).
        auto_augment: timm policy string, e.g. "rand-m9-mstd0.5-inc1"; None or "" disables it.
        re_prob: Random-erasing probability.
        color_jitter: Color-jitter strength (timm skips it when RandAugment is on, as DeiT does).
        interpolation: Resize interpolation, e.g. "bicubic".
        eval_crop_pct: Center-crop fraction at eval (resize to image_size / eval_crop_pct first).
        pin_memory: Page-locked batches for faster host-to-GPU copies.
        seed: Seed of the training order (a fresh permutation per epoch, resumable mid-epoch).
        repeated_augmentation: DeiT's repeated augmentation when above 1: each epoch draws about N / k images and
            shows each k times, on neighbouring ranks with their own random augmentations, in an epoch of about N
            samples (:class:`~datamodules.samplers.RepeatedAugmentationSampler`; DeiT uses 3). 1 reads every image
            once per epoch.
    """

    def __init__(
        self,
        root: str,
        image_size: Annotated[int, Ge(1)] = 224,
        batch_size: Annotated[int, Ge(1)] | None = None,
        global_batch_size: Annotated[int, Ge(1)] | None = None,
        num_workers: Annotated[int, Ge(0)] = 8,
        auto_augment: str | None = "rand-m9-mstd0.5-inc1",
        re_prob: Annotated[float, Interval(ge=0, le=1)] = 0.25,
        color_jitter: Annotated[float, Ge(0)] = 0.3,
        interpolation: str = "bicubic",
        eval_crop_pct: Annotated[float, Interval(gt=0, le=1)] = 0.875,
        pin_memory: bool = True,
        seed: int = 0,
        repeated_augmentation: Annotated[int, Ge(1)] = 1,
    ) -> None:
        super().__init__()
        for name, value in (("image_size", image_size), ("batch_size", batch_size)):
            if value is not None and value <= 0:
                raise ValueError(f"{name}={value} must be a positive integer")
        if global_batch_size is not None and global_batch_size <= 0:
            raise ValueError(f"global_batch_size={global_batch_size} must be a positive integer (or null)")
        if batch_size is not None and global_batch_size is not None:
            raise ValueError(
                f"batch_size={batch_size} and global_batch_size={global_batch_size} are both set; set one "
                "(e.g. --data.init_args.global_batch_size=null to give a per-device batch_size)"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if repeated_augmentation < 1:
            raise ValueError(f"repeated_augmentation={repeated_augmentation} must be >= 1 (1: off; DeiT: 3)")
        if not 0.0 <= re_prob <= 1.0:
            raise ValueError(f"re_prob={re_prob} must lie in [0, 1]")
        if color_jitter < 0:
            raise ValueError(f"color_jitter={color_jitter} must be >= 0")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation={interpolation!r} is not supported; valid: {', '.join(INTERPOLATIONS)}")
        if not 0.0 < eval_crop_pct <= 1.0:
            raise ValueError(f"eval_crop_pct={eval_crop_pct} must lie in (0, 1]")
        self.save_hyperparameters()
        self.root = Path(root)
        self.image_size = image_size
        self.batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        self.global_batch_size = global_batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.seed = seed
        self.repeated_augmentation = repeated_augmentation
        self.train_sampler: RandomPermutationSampler | RepeatedAugmentationSampler | None = None
        # Built now so a bad policy string fails at construction, not hours later in a worker.
        try:
            self.train_transform = create_transform(
                input_size=image_size,
                is_training=True,
                auto_augment=auto_augment or None,
                re_prob=re_prob,
                re_mode="pixel",  # DeiT erases with per-pixel normal noise
                re_count=1,
                color_jitter=color_jitter,
                interpolation=interpolation,
            )
        except (AssertionError, KeyError, ValueError, IndexError) as err:
            raise ValueError(
                f"auto_augment={auto_augment!r} is not a timm augmentation policy "
                f"(e.g. 'rand-m9-mstd0.5-inc1', 'augmix-m5-w4-d2', 'trivialaugment'): {err!r}"
            ) from None
        self.eval_transform = create_transform(
            input_size=image_size, is_training=False, interpolation=interpolation, crop_pct=eval_crop_pct
        )
        self._class_names: list[str] | None = None
        self.train_dataset: SkipBrokenImages | None = None
        self.val_dataset: SkipBrokenImages | None = None

    # ----------------------------------------------------------------------------------- discovery

    def _split_dir(self, split: str) -> Path:
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"ImageFolder root {str(self.root)!r} does not exist; it must hold train/ and val/ class directories"
            )
        path = self.root / split
        if not path.is_dir():
            raise FileNotFoundError(
                f"{str(path)!r} is missing; root must hold train/ and val/ directories of class folders"
            )
        return path

    @property
    def class_names(self) -> list[str]:
        """Sorted class-directory names of train/ (label i is class_names[i])."""
        if self._class_names is None:
            train_dir = self._split_dir("train")
            try:
                self._class_names = find_classes(str(train_dir))[0]
            except FileNotFoundError:
                raise ValueError(f"{str(train_dir)!r} holds no class directories") from None
        return self._class_names

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_broken_images(self) -> int:
        """Unreadable files skipped so far over train and val, all workers included."""
        return sum(d.num_broken for d in (self.train_dataset, self.val_dataset) if d is not None)

    def _folder(self, split: str, transform: torch.nn.Module) -> SkipBrokenImages:
        split_dir = self._split_dir(split)
        classes = self.class_names
        extra = sorted({p.name for p in split_dir.iterdir() if p.is_dir()} - set(classes))
        if extra:
            raise ValueError(f"{str(split_dir)!r} has class directories absent from train/: {', '.join(extra[:5])}")
        folder = _ClassFolder(split_dir, classes, transform)
        if len(folder) == 0:
            raise ValueError(
                f"{str(split_dir)!r} holds no images ({', '.join(IMG_EXTENSIONS)}) in its class directories"
            )
        dataset = SkipBrokenImages(folder)
        dataset.check_decodable()
        return dataset

    # ------------------------------------------------------------------------------------ lifecycle

    def per_device_batch_size(self) -> int:
        """``batch_size``, or ``global_batch_size`` split over the data-parallel replicas and accumulation steps.

        The replicas are the ranks that read different batches (:func:`datamodules.batching.data_parallel_replicas`),
        not the processes: under tensor parallelism the ranks of one replica read the same batch, so 2 replicas of
        2 tensor-parallel ranks each read global / (2 x accumulation) images, not global / 4."""
        if self.global_batch_size is None:
            return self.batch_size
        replicas = data_parallel_replicas(self.trainer)
        accumulate = self.trainer.accumulate_grad_batches if self.trainer is not None else 1
        per_device, rest = divmod(self.global_batch_size, replicas * accumulate)
        if rest or per_device == 0:
            raise ValueError(
                f"global_batch_size={self.global_batch_size} does not split evenly over {replicas} data-parallel "
                f"replicas x {accumulate} accumulation steps; use a multiple of {replicas * accumulate}"
            )
        rank_zero_info(
            f"per-device batch {per_device} = global batch {self.global_batch_size} / "
            f"({replicas} data-parallel replicas x {accumulate} accumulation steps)"
        )
        return per_device

    def setup(self, stage: str | None = None) -> None:
        """Scans train/ (for fit) and val/ (for every stage; it doubles as test); derives the per-device batch.
        Under several ranks, checks that every rank found the same images (:mod:`datamodules.fingerprint`: each
        one's path, class and size)."""
        self.batch_size = self.per_device_batch_size()
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._folder("train", self.train_transform)
            self.train_sampler = self._train_order(len(self.train_dataset))
        if self.val_dataset is None:
            self.val_dataset = self._folder("val", self.eval_transform)
        datasets = [d.dataset for d in (self.train_dataset, self.val_dataset) if d is not None]
        images = (f"{os.path.relpath(p, self.root)}\t{c}\t{os.path.getsize(p)}" for d in datasets for p, c in d.samples)
        check_same_items(images, f"image folder {self.root}")

    def _train_order(self, size: int) -> RandomPermutationSampler | RepeatedAugmentationSampler:
        if self.repeated_augmentation == 1:
            return RandomPermutationSampler(size, self.seed)
        replicas = data_parallel_replicas(self.trainer)
        return RepeatedAugmentationSampler(size, self.repeated_augmentation, replicas, self.seed)

    def teardown(self, stage: str) -> None:
        if self.num_broken_images:
            rank_zero_warn(f"{self.num_broken_images} unreadable images were skipped under {self.root}")

    def _loader(self, dataset: SkipBrokenImages | None, train: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        sampler = self.train_sampler if train else None
        return make_loader(dataset, self.batch_size, train_sampler=sampler, trainer=self.trainer,
                           num_workers=self.num_workers, pin_memory=self.pin_memory)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        """The val split (ImageNet has no public test labels)."""
        return self._loader(self.val_dataset, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)
