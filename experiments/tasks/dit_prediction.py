"""The DiT ``predict`` output: samples as PNGs plus an ADM ``samples.npz``, resumable batch by batch.

    <output_dir or run dir>/predictions/<settings>/    one directory per sampling settings and weights
        0000012_class3.png ...                          one PNG per sample, named by its row and class
        chunk_<first row>.npz                           a part file per batch: a rerun skips the batches it finds
        samples.npz                                     every part of this run joined by first row (ADM layout)

Sample ``row`` is seeded with ``sample_seed * 2**32 + row``: distinct over ranks and batches and the same on
a rerun.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image
from torch import Tensor

from experiments.reliability.layout import trainer_run_dir
from experiments.tasks.sampling import (
    SEED_STRIDE,
    chunk_path,
    prepare_directory,
    sampling_settings,
    settings_dirname,
    write_adm_npz,
    write_chunk,
)


class Predictions:
    """One ``predict`` run of a :class:`experiments.tasks.dit.LatentDiffusion` module (held by the module)."""

    def __init__(self, module) -> None:
        self.module = module
        self.parts: list[int] = []
        self._directory: Path | None = None

    @property
    def directory(self) -> Path:
        """Created by rank 0 on first use (with the settings it belongs to); every rank waits for it."""
        if self._directory is None:
            module, hp = self.module, self.module.hparams
            settings = sampling_settings(module)
            root = Path(hp.output_dir or trainer_run_dir(module.trainer))
            directory = root / "predictions" / settings_dirname(settings, hp.sample_seed)
            if module.trainer.is_global_zero:
                prepare_directory(directory, {"seed": hp.sample_seed, **settings})
            module.trainer.strategy.barrier()
            self._directory = directory
        return self._directory

    def step(self, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor | None:
        """Samples for a batch of (latent, label, row): PNGs and a part file, or nothing if the part exists."""
        module = self.module
        _, labels, rows = batch
        directory = self.directory
        part = int(rows[0])
        self.parts.append(part)
        if chunk_path(directory, part).is_file():
            return None
        seeds = [module.hparams.sample_seed * SEED_STRIDE + int(r) for r in rows]
        try:
            should_stop = lambda: module.trainer.received_sigterm  # noqa: E731 - checked before every step
            images = module.generate(labels.to(module.device), seeds, should_stop=should_stop)
        except InterruptedError:
            stop = SIGTERMException()
            stop.add_note(f"predict interrupted by SIGTERM; finished batches are in {directory}: rerun to resume")
            raise stop from None
        nhwc = images.permute(0, 2, 3, 1).cpu().numpy()
        for img, label, row in zip(nhwc, labels.tolist(), rows.tolist(), strict=True):
            Image.fromarray(img).save(directory / f"{row:07d}_class{label}.png")
        write_chunk(directory, part, images, labels, rows.tolist())
        return images

    def finish(self) -> None:
        """Rank 0 joins the parts of this run (all ranks', repeats dropped) into ``samples.npz``, by first row."""
        trainer, parts = self.module.trainer, self.parts
        if trainer.world_size > 1:
            gathered: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, parts)
            parts = [p for rank_parts in gathered for p in rank_parts]
        if trainer.is_global_zero and parts:
            directory = self.directory
            path = write_adm_npz([chunk_path(directory, p) for p in sorted(set(parts))], directory / "samples.npz")
            print(f"predict: {path} (ADM layout) and one PNG per sample in {directory}")
