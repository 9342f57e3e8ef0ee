"""``python -m datamodules.encode_latents``: encode an image dataset ONCE into a sharded latent cache.

    python -m datamodules.encode_latents --vae runs/vae/tiny/vae --out data/latents/fashion-mnist-tiny
    python -m datamodules.encode_latents --vae /models/sd-vae-ft-ema --out data/latents/imagenet256 \\
        --image-folder /data/imagenet/train --image-size 256

Sources: ``--source embedded`` (default) is the official train split of the embedded images
(Fashion-MNIST, else sklearn digits), resized to ``--image-size`` as the VAE run saw them;
``--image-folder ROOT`` is a torchvision ImageFolder (class directories directly under ROOT) with
the DiT/ADM center crop. Every image is encoded as-is and mirrored (unless ``--no-flip``); the
stored latent is the posterior mean (or a sample with ``--sample``) times the VAE's scaling
factor. The layout is described in datamodules/latents.py. Shards and meta.json are written
atomically, meta.json last; a rerun with the same settings prints "cache exists" and stops.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from datamodules.image_folder import SkipBrokenImages
from datamodules.images import UInt8ImageDataset, load_embedded_images, resize_uint8
from datamodules.latents import META_FILE, LatentCacheMeta, LatentShardWriter, read_latent_meta
from models.vae import load_vae

# Settings a rerun must share with an existing cache for it to be reused.
IDENTITY_KEYS = ("vae_path", "vae_sha256", "scaling_factor", "shift_factor", "source", "source_name", "image_size",
                 "count", "flip", "sample", "dtype", "shard_size")  # fmt: skip


def center_crop_arr(pil_image: Image.Image, image_size: int) -> Image.Image:
    """The ADM / DiT center crop: box-downsample by 2 while possible, bicubic resize, center crop."""
    while min(*pil_image.size) >= 2 * image_size:
        pil_image = pil_image.resize(tuple(x // 2 for x in pil_image.size), resample=Image.BOX)
    scale = image_size / min(*pil_image.size)
    pil_image = pil_image.resize(tuple(round(x * scale) for x in pil_image.size), resample=Image.BICUBIC)
    arr = np.array(pil_image)
    crop_y, crop_x = (arr.shape[0] - image_size) // 2, (arr.shape[1] - image_size) // 2
    return Image.fromarray(arr[crop_y : crop_y + image_size, crop_x : crop_x + image_size])


def embedded_source(image_size: int, limit: int | None = None) -> tuple[Dataset, list[str], str]:
    """(dataset of uint8 (3, S, S) images and labels, class names, name) of the embedded train split.

    The images are resized once, as `EmbeddedImageDataModule` does, so the VAE sees what it trained on.
    """
    train = load_embedded_images("train")
    images = torch.from_numpy(np.ascontiguousarray(train.images[:limit])).unsqueeze(1)  # (N, 1, H, W)
    labels = torch.from_numpy(train.labels[:limit])
    dataset = UInt8ImageDataset(resize_uint8(images, image_size), labels, image_size)
    return dataset, list(train.class_names), train.name


def image_folder_source(root: str, image_size: int) -> tuple[Dataset, list[str], str]:
    """(dataset of uint8 (3, S, S) center crops and labels, class names, absolute root) of an ImageFolder."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"--image-folder {root!r} is not a directory of class directories")
    crop = functools.partial(center_crop_arr, image_size=image_size)  # picklable for worker processes
    folder = ImageFolder(root, transform=v2.Compose([crop, v2.PILToTensor()]))
    return SkipBrokenImages(folder), list(folder.classes), str(Path(root).resolve())


def vae_fingerprint(vae_dir: str | Path) -> str:
    """sha256 over the VAE's config.json and weight files (a retrained VAE at the same path differs)."""
    digest = hashlib.sha256()
    files = [
        p for p in sorted(Path(vae_dir).iterdir()) if p.name == "config.json" or p.suffix in (".safetensors", ".bin")
    ]
    for path in files:
        digest.update(path.name.encode())
        with open(path, "rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 24), b""):
                digest.update(chunk)
    return digest.hexdigest()


@torch.no_grad()
def encode_batch(vae, images: torch.Tensor, sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> scaled latents (B, C, h, w) float32: ``(z - shift) * scaling_factor``."""
    x = images.to(vae.device, torch.float32) / 127.5 - 1.0  # [0, 255] -> [-1, 1]
    posterior = vae.encode(x).latent_dist
    z = posterior.sample(generator=generator) if sample else posterior.mean
    shift = vae.config.get("shift_factor") or 0.0
    return ((z - shift) * vae.config.scaling_factor).float()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m datamodules.encode_latents", description=__doc__.split("\n")[0])
    parser.add_argument("--vae", required=True, help="AutoencoderKL directory (save_pretrained layout)")
    parser.add_argument("--out", required=True, help="cache directory to write")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--source", choices=["embedded"], default="embedded", help="the embedded train split")
    source.add_argument("--image-folder", default=None, metavar="ROOT", help="ImageFolder root (class dirs)")
    parser.add_argument("--image-size", type=int, default=32, help="image side fed to the VAE")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (image decoding)")
    parser.add_argument("--no-flip", action="store_true", help="skip the horizontally flipped copies")
    parser.add_argument("--shard-size", type=int, default=50000, help="source images per shard")
    parser.add_argument("--sample", action="store_true", help="store posterior samples instead of means")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample")
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="storage dtype")
    parser.add_argument("--limit", type=int, default=None, help="encode only the first N images (quick runs)")
    parser.add_argument("--device", default="auto", help="'auto' (cuda if available), 'cpu', 'cuda:1', ...")
    parser.add_argument("--overwrite", action="store_true", help="replace a cache made with other settings")
    args = parser.parse_args(argv)
    for name in ("image_size", "batch_size", "shard_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.limit is not None and args.limit <= 0:
        parser.error("--limit must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out, flip = Path(args.out), not args.no_flip
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    try:
        vae = load_vae(args.vae).to(device).eval()
        if args.image_folder is not None:
            dataset, class_names, name = image_folder_source(args.image_folder, args.image_size)
            source = "image-folder"
        else:
            dataset, class_names, name = embedded_source(args.image_size, args.limit)
            source = "embedded"
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    if args.limit is not None and len(dataset) > args.limit:
        dataset = Subset(dataset, range(args.limit))
    downsample = 2 ** (len(vae.config.block_out_channels) - 1)  # each encoder block but the last halves the side
    if args.image_size % downsample:
        raise SystemExit(
            f"error: --image-size {args.image_size} is not a multiple of the VAE's downsampling {downsample}"
        )
    latent_hw = args.image_size // downsample
    meta = LatentCacheMeta(
        num_classes=len(class_names),
        class_names=class_names,
        latent_shape=[vae.config.latent_channels, latent_hw, latent_hw],
        scaling_factor=float(vae.config.scaling_factor),
        shift_factor=vae.config.get("shift_factor"),
        vae_path=str(Path(args.vae).resolve()),
        vae_sha256=vae_fingerprint(args.vae),
        source=source,
        source_name=name,
        image_size=args.image_size,
        count=len(dataset),
        flip=flip,
        sample=args.sample,
        dtype=args.dtype,
        shard_size=args.shard_size,
    )
    if (out / META_FILE).is_file():
        old = read_latent_meta(out)
        differs = [k for k in IDENTITY_KEYS if getattr(old, k) != getattr(meta, k)]
        if not differs:
            print(f"cache exists: {out} ({old.count} latents of shape {tuple(old.latent_shape)}, flip={old.flip})")
            return 0
        if not args.overwrite:
            raise SystemExit(
                f"{out} holds a cache made with other settings ({', '.join(differs)}); "
                "pass --overwrite or choose another --out"
            )
        (out / META_FILE).unlink()  # the cache is incomplete from here until the new meta.json lands
    out.mkdir(parents=True, exist_ok=True)

    generator = torch.Generator(device).manual_seed(args.seed) if args.sample else None
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers)
    writer, start, done = LatentShardWriter(out, args.shard_size, args.dtype), time.perf_counter(), 0
    for images, labels in loader:
        latents = encode_batch(vae, images, args.sample, generator).cpu().numpy()
        flipped = None
        if flip:
            mirrored = torch.flip(images, dims=[-1])  # (B, 3, S, S): mirror the width axis
            flipped = encode_batch(vae, mirrored, args.sample, generator).cpu().numpy()
        writer.add(latents, flipped, np.asarray(labels))
        done += len(labels)
        rate = done / (time.perf_counter() - start)
        print(f"\r{done}/{meta.count} images encoded ({rate:.0f}/s)", end="", flush=True)
    meta.shards = writer.close()
    meta.write(out)  # last: its presence marks a complete cache
    files = [out / name for shard in meta.shards for key, name in shard.items() if key != "count" and name]
    size_mib = sum(f.stat().st_size for f in files) / 2**20
    print(
        f"\nwrote {meta.count} latents{' + flipped' if flip else ''} of shape {tuple(meta.latent_shape)} to {out} "
        f"in {time.perf_counter() - start:.1f}s ({size_mib:.1f} MiB, scaling_factor={meta.scaling_factor:.6g})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
