"""``python -m datamodules.latents.encode``: encode an image dataset ONCE into a sharded latent cache.

    python -m datamodules.latents.encode --vae runs/vae/tiny/vae --out data/latents/fashion-mnist-tiny
    python -m datamodules.latents.encode --vae /models/sd-vae-ft-ema --out data/latents/imagenet256 \\
        --image-folder /data/imagenet/train --image-size 256

Sources: ``--source embedded`` (default) is the official train split of the embedded images
(Fashion-MNIST, else sklearn digits), resized to ``--image-size`` as the VAE run saw them;
``--image-folder ROOT`` is a torchvision ImageFolder (class directories directly under ROOT) with
the DiT/ADM center crop. Every image is encoded as-is and mirrored (unless ``--no-flip``); the
stored latent is the posterior mean (or a sample with ``--sample``) times the VAE's scaling
factor. The layout is described in datamodules/latents/cache.py.

Safe to interrupt and to rerun: shards are written atomically, ``encoding.json`` records the finished
ones and meta.json comes last. SIGTERM / Ctrl-C stop within a batch, keep what was encoded (the
partial shard included) and exit 143 / 130; the same command resumes. A rerun with the same settings
prints "cache exists" and stops. ``--out`` must be new, empty, or a latent cache: one made with other
settings is replaced only with ``--overwrite`` (the old cache stays readable until the new meta.json
replaces it, then its files are deleted); a directory that is not a latent cache is never touched.
One encoding at a time per ``--out`` (``.encode.lock`` while it runs): a second one stops in one line naming
the first (exit 2) before it loads the VAE, and the first finishes whole. Bad input is one line ``error: ...``
and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2
from tqdm import tqdm

from datamodules.latents.cache import (
    META_FILE,
    SHARD_KEYS,
    LatentCacheMeta,
    LatentShardWriter,
    check_shard_names,
    read_latent_meta,
)
from fileio import InputError, atomic_write_json, output_dir
from fileio.locks import claim_output, unlock

# LAZY: the VAE (diffusers) and the image DataModules (Lightning) are imported where they are used, after --out's
# lock is taken and the arguments checked: a command refused (a cache in use, a bad value) ends in a second or two
# instead of after the seconds those imports take.

# Settings a rerun must share with an existing cache for it to be reused.
IDENTITY_KEYS = ("vae_path", "vae_sha256", "scaling_factor", "shift_factor", "source", "source_name", "image_size",
                 "count", "flip", "sample", "dtype", "shard_size", "seed")  # fmt: skip
PROGRESS_FILE = "encoding.json"  # the shards an unfinished encoding has written so far
LOCK_FILE = ".encode.lock"  # held while an encoding writes the cache; removed when it ends
USAGE_ERROR = 2


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
    from datamodules.images.embedded import UInt8ImageDataset, load_embedded_images, resize_uint8  # see LAZY

    train = load_embedded_images("train")
    images = torch.from_numpy(np.ascontiguousarray(train.images[:limit])).unsqueeze(1)  # (N, 1, H, W)
    labels = torch.from_numpy(train.labels[:limit])
    dataset = UInt8ImageDataset(resize_uint8(images, image_size), labels, image_size)
    return dataset, list(train.class_names), train.name


def image_folder_source(root: str, image_size: int) -> tuple[Dataset, list[str], str]:
    """(dataset of uint8 (3, S, S) center crops and labels, class names, absolute root) of an ImageFolder."""
    if not Path(root).is_dir():
        raise FileNotFoundError(f"--image-folder {root!r} is not a directory of class directories")
    from datamodules.images.folder import SkipBrokenImages  # see LAZY

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
def encode_batch(vae, images: torch.Tensor, generators: list[torch.Generator] | None) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> scaled latents (B, C, h, w) float32: ``(z - shift) * scaling_factor``.

    ``generators`` (one per image) draw posterior samples; None takes the posterior mean.
    """
    x = images.to(vae.device, torch.float32) / 127.5 - 1.0  # [0, 255] -> [-1, 1]
    posterior = vae.encode(x).latent_dist
    z = posterior.sample(generator=generators) if generators is not None else posterior.mean
    shift = vae.config.get("shift_factor") or 0.0
    return ((z - shift) * vae.config.scaling_factor).float()


def row_generators(seed: int, rows: range, flipped: bool, device: torch.device) -> list[torch.Generator]:
    """One generator per source row, so ``--sample`` draws the same noise however the rows are batched
    (and whether the encoding was interrupted and resumed); the mirrored copy has its own stream."""
    base = seed * 2**33 + (2**32 if flipped else 0)
    return [torch.Generator(device).manual_seed(base + row) for row in rows]


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage block) with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        head, says_valid, valid = message.partition("; valid: ")
        if not says_valid:
            valid = f"see {self.prog} --help"
        self.exit(USAGE_ERROR, f"error: {head} (command line); valid: {valid}\n")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m datamodules.latents.encode", description=__doc__.split("\n")[0])
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
    parser.add_argument("--overwrite", action="store_true", help="replace a latent cache made with other settings")
    args = parser.parse_args(argv)
    for name in ("image_size", "batch_size", "shard_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    if args.limit is not None and args.limit <= 0:
        parser.error(f"--limit {args.limit} must be positive")
    if args.num_workers < 0 or not 0 <= args.seed < 2**30:
        parser.error(f"--num-workers {args.num_workers} / --seed {args.seed} out of range (>= 0, seed < 2**30)")
    if args.device != "auto":
        try:
            device = torch.device(args.device)
        except RuntimeError:  # not a device name ("gpu")
            device = torch.device("meta")
        if not (device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available())):
            parser.error(f"--device {args.device!r} is not a device this machine has; valid: auto, cpu, cuda, cuda:N")
    try:
        output_dir(args.out, "--out")  # a file in the way is found now, not after the VAE is loaded
    except InputError as err:
        parser.error(str(err))
    return args


def settings_tag(meta: LatentCacheMeta) -> str:
    """A short hash of the settings a cache is made with; it goes into the shard file names."""
    identity = {k: getattr(meta, k) for k in IDENTITY_KEYS}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]


def shard_files(out: Path, shards: list[dict]) -> list[Path]:
    return [out / shard[key] for shard in shards for key in SHARD_KEYS if shard.get(key)]


@dataclass
class OutputPlan:
    """What to do with ``--out``: resume from ``shards``, and delete ``replaced`` once the new cache is complete."""

    exists: bool = False
    shards: list[dict] = field(default_factory=list)
    replaced: list[Path] = field(default_factory=list)


def plan_output(out: Path, meta: LatentCacheMeta, tag: str, overwrite: bool) -> OutputPlan:
    """Decides between "cache exists", resume, a fresh cache, and replacing one (``--overwrite``).

    Raises:
        ValueError: one line when ``--out`` holds something this command must not touch.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file (command line); valid: a new or empty directory")
    plan = OutputPlan()
    if (out / META_FILE).is_file():
        old = read_latent_meta(out)  # a corrupt meta.json is reported, never replaced blindly
        differs = [k for k in IDENTITY_KEYS if getattr(old, k) != getattr(meta, k)]
        if not differs:
            print(f"cache exists: {out} ({old.count} latents of shape {tuple(old.latent_shape)}, flip={old.flip})")
            return OutputPlan(exists=True)
        if not overwrite:
            raise ValueError(
                f"--out {str(out)!r} holds a latent cache made with other settings ({', '.join(differs)}); "
                "valid: the same settings, another --out, or --overwrite to replace it"
            )
        plan.replaced += shard_files(out, old.shards)
    progress = out / PROGRESS_FILE
    if progress.is_file():
        try:
            record = json.loads(progress.read_text())
            check_shard_names(out, record["shards"], meta.flip, progress)
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{str(progress)!r} is not an encoding record ({err}); valid: delete it") from None
        if record.get("tag") == tag:
            plan.shards = record["shards"]
        elif not overwrite:
            raise ValueError(
                f"--out {str(out)!r} holds an unfinished encoding with other settings ({progress}); "
                "valid: the same settings (resumes), another --out, or --overwrite"
            )
        else:
            plan.replaced += shard_files(out, record["shards"])
    elif out.is_dir() and not (out / META_FILE).is_file():
        found = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)
        if found:
            raise ValueError(
                f"--out {str(out)!r} is not a latent cache (it holds {', '.join(found[:3])}"
                f"{', ...' if len(found) > 3 else ''}); valid: a new or empty directory, or a latent cache"
            )
    return plan


@contextmanager
def stop_on_signals() -> Iterator[list[int]]:
    """SIGTERM / SIGINT set a flag (the list gets the signal number) instead of killing the process,
    so the loop can finish its batch and save; the previous handlers come back afterwards."""
    received: list[int] = []
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def build_meta(args: argparse.Namespace, vae) -> tuple[Dataset, LatentCacheMeta]:
    """The dataset to encode and the meta.json it will get (shards filled in at the end)."""
    if args.image_folder is not None:
        dataset, class_names, name = image_folder_source(args.image_folder, args.image_size)
        source = "image-folder"
    else:
        dataset, class_names, name = embedded_source(args.image_size, args.limit)
        source = "embedded"
    if args.limit is not None and len(dataset) > args.limit:
        dataset = Subset(dataset, range(args.limit))
    downsample = 2 ** (len(vae.config.block_out_channels) - 1)  # each encoder block but the last halves the side
    if args.image_size % downsample:
        raise ValueError(
            f"--image-size {args.image_size} (command line); valid: a multiple of the VAE's downsampling {downsample}"
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
        flip=not args.no_flip,
        sample=args.sample,
        dtype=args.dtype,
        shard_size=args.shard_size,
        seed=args.seed if args.sample else None,
    )
    return dataset, meta


def write_progress(out: Path, tag: str, meta: LatentCacheMeta, shards: list[dict]) -> None:
    record = {"tag": tag, "count": meta.count, "done": sum(s["count"] for s in shards), "shards": shards}
    atomic_write_json(out / PROGRESS_FILE, record)


def lock_out(out: Path) -> IO[str]:
    """Takes ``--out``'s lock (``.encode.lock``, an ``flock`` the kernel drops when this process ends however it
    ends: a killed encoding never blocks the next).

    Raises:
        ValueError: another encoding holds it (one line naming it); nothing is changed.
    """
    return claim_output(out, LOCK_FILE, "latents.encode", "finds the cache")


def encode(args: argparse.Namespace) -> int:
    """Encodes (or resumes, or skips) the cache under ``--out``'s lock; returns the exit status.

    The lock comes first, before the VAE is loaded: a second encoding into the same ``--out`` stops at once, and
    what ``--out`` holds (a cache, an unfinished encoding) is read only while no other encoding can change it.
    """
    out = Path(args.out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = lock_out(out)
    try:
        return encode_locked(args, out)
    finally:
        unlock(lock, remove=True)
        if created:
            with contextlib.suppress(OSError):  # refused before writing anything: the new directory goes too
                out.rmdir()


def encode_locked(args: argparse.Namespace, out: Path) -> int:
    """:func:`encode` once this process holds ``--out``'s lock."""
    from models.vae import load_vae  # see LAZY

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    vae = load_vae(args.vae).to(device).eval()
    dataset, meta = build_meta(args, vae)
    tag = settings_tag(meta)
    plan = plan_output(out, meta, tag, args.overwrite)
    if plan.exists:
        return 0
    writer = LatentShardWriter(
        out, args.shard_size, args.dtype, tag, plan.shards, on_flush=lambda s: write_progress(out, tag, meta, s)
    )
    first = sum(s["count"] for s in plan.shards)  # rows already encoded by an interrupted run
    remaining = Subset(dataset, range(first, meta.count))
    loader = DataLoader(remaining, batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers)
    start, row = time.perf_counter(), first
    bar = tqdm(total=meta.count, initial=first, unit="img", desc="encoding", dynamic_ncols=True, mininterval=1.0)
    with stop_on_signals() as received:
        for images, labels in loader:
            rows = range(row, row + len(labels))
            gen = row_generators(args.seed, rows, False, device) if args.sample else None
            latents = encode_batch(vae, images, gen).cpu().numpy()
            flipped = None
            if meta.flip:
                mirrored = torch.flip(images, dims=[-1])  # (B, 3, S, S): mirror the width axis
                gen = row_generators(args.seed, rows, True, device) if args.sample else None
                flipped = encode_batch(vae, mirrored, gen).cpu().numpy()
            writer.add(latents, flipped, np.asarray(labels))
            row += len(labels)
            bar.update(len(labels))
            if received:
                break
        meta.shards = writer.close()  # the last (possibly partial) shard, recorded in encoding.json
    bar.close()
    if row < meta.count:
        name = signal.Signals(received[0]).name
        print(f"interrupted by {name}: {row}/{meta.count} images encoded into {out}; rerun the same command to resume")
        return 128 + received[0]
    meta.write(out)  # last: its presence marks a complete cache, and replaces an old one in one step
    (out / PROGRESS_FILE).unlink(missing_ok=True)
    keep = set(shard_files(out, meta.shards))
    for path in plan.replaced:  # files of the cache (or unfinished encoding) that --overwrite replaced
        if path not in keep:
            path.unlink(missing_ok=True)
    size_mib = sum(f.stat().st_size for f in keep) / 2**20
    print(
        f"wrote {meta.count} latents{' + flipped' if meta.flip else ''} of shape {tuple(meta.latent_shape)} to {out} "
        f"in {time.perf_counter() - start:.1f}s ({size_mib:.1f} MiB, scaling_factor={meta.scaling_factor:.6g})"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; bad input is one line on stderr and exit status 2."""
    args = parse_args(argv)
    try:
        return encode(args)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
