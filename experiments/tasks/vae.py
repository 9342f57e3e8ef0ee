"""Train a small diffusers ``AutoencoderKL`` from scratch (the network and its loader live in :mod:`models.vae`).

    images in [-1, 1] --encode--> q(z|x) = N(mean, std^2) --sample--> z --decode--> reconstruction
    loss = |x - rec|_1 (or MSE)  +  kl_weight * KL(q(z|x) || N(0, I))      (KL summed per image)

At fit end (rank 0) the latent scaling factor is measured as ``1 / std(mean latents)`` over up to
``scaling_images`` training images (the Stable Diffusion recipe that gave 0.18215), written into the
VAE config and the VAE is saved with ``save_pretrained``; the DiT latent cache
(``python -m datamodules.latents.encode --vae DIR``) reads it back with :func:`models.vae.load_vae`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, NamedTuple

import lightning as L
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.image import PeakSignalNoiseRatio
from torchvision.utils import make_grid

from experiments.monitoring.hparams import declare_hparams
from experiments.monitoring.step_mean import StepMean
from experiments.reliability.layout import trainer_run_dir
from experiments.tasks.optim import warmup_cosine
from models.vae import build_vae

__all__ = ["AutoencoderTraining", "VaeLosses", "compute_scaling_factor"]

OWNER_FILE = "written_by.json"  # in the saved VAE directory: which run saved it


@torch.no_grad()
def compute_scaling_factor(vae: AutoencoderKL, batches: Iterable[Tensor], max_images: int = 2000) -> float:
    """``1 / std`` of the posterior means over up to ``max_images`` images, so scaled latents have unit std.

    Args:
        vae: The autoencoder (put in eval mode for the measurement, then restored).
        batches: Image batches in [-1, 1], (B, C, H, W) each.
        max_images: Stop after this many images.
    """
    was_training, device = vae.training, next(vae.parameters()).device
    vae.eval()
    means, seen = [], 0
    for images in batches:
        images = images[: max_images - seen].to(device, torch.float32)
        means.append(vae.encode(images).latent_dist.mean.float().cpu())
        seen += len(images)
        if seen >= max_images:
            break
    vae.train(was_training)
    if not means:
        raise ValueError("no images to measure the latent scaling factor on")
    return 1.0 / torch.cat(means).std().item()


class VaeLosses(NamedTuple):
    """One autoencoding pass: total loss, its parts, and the reconstruction."""

    loss: Tensor
    rec_loss: Tensor
    kl: Tensor  # per image, averaged over the batch
    reconstruction: Tensor


class AutoencoderTraining(L.LightningModule):
    """A small KL autoencoder (diffusers ``AutoencoderKL``) trained from scratch on [-1, 1] images.

    Args:
        block_out_channels: Channels per resolution level; ``len - 1`` halvings of the side.
        layers_per_block: ResNet blocks per encoder level (the decoder has one more).
        latent_channels: Channels of the latent.
        norm_num_groups: GroupNorm groups (must divide every entry of ``block_out_channels``).
        kl_weight: Weight of the KL term (per-image sum) against the per-pixel reconstruction loss.
        rec_loss: "l1" or "mse" reconstruction loss.
        lr: Peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_steps: Linear warmup length in optimizer steps.
        schedule: "cosine" decay to ``min_lr_ratio * lr`` after warmup, or "constant".
        min_lr_ratio: Final learning rate as a fraction of ``lr``.
        output_dir: Where ``save_pretrained`` writes at fit end; None means ``<run dir>/vae``. A VAE there
            written by another run (latent caches depend on it) is refused at fit start.
        overwrite_output: Replace a VAE in ``output_dir`` that another run wrote.
        scaling_images: Training images the latent scaling factor is measured on.
        num_log_images: Originals (top row) and reconstructions (bottom row) in the TensorBoard grid.
        in_channels: Image channels.
        img_size: Image side, linked from the DataModule (stored as the VAE's ``sample_size``).
    """

    task = "vae"
    key_metric = "val/rec_loss"

    def __init__(
        self,
        block_out_channels: Sequence[int] = (32, 64, 64),
        layers_per_block: int = 1,
        latent_channels: int = 4,
        norm_num_groups: int = 16,
        kl_weight: float = 1e-6,
        rec_loss: Literal["l1", "mse"] = "l1",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 100,
        schedule: Literal["cosine", "constant"] = "cosine",
        min_lr_ratio: float = 0.1,
        output_dir: str | None = None,
        overwrite_output: bool = False,
        scaling_images: int = 2000,
        num_log_images: int = 8,
        in_channels: int = 3,
        img_size: int = 32,
    ) -> None:
        super().__init__()
        self.step_mean = StepMean()  # train/loss: the optimizer step's mean over its micro-batches
        if rec_loss not in ("l1", "mse"):
            raise ValueError(f"rec_loss={rec_loss!r} is not a reconstruction loss; valid: l1, mse")
        if kl_weight < 0 or lr <= 0 or weight_decay < 0 or warmup_steps < 0:
            raise ValueError(
                "need kl_weight >= 0, lr > 0, weight_decay >= 0, warmup_steps >= 0; "
                f"got {kl_weight=}, {lr=}, {weight_decay=}, {warmup_steps=}"
            )
        block_out_channels = [int(c) for c in block_out_channels]  # hparams hold a plain list
        self.save_hyperparameters()
        self.vae = build_vae(
            block_out_channels, layers_per_block, latent_channels, norm_num_groups, in_channels, img_size
        )
        self.rec_losses = torch.nn.ModuleDict({s: MeanMetric() for s in ("val", "test")})
        self.psnr = torch.nn.ModuleDict({s: PeakSignalNoiseRatio(data_range=2.0) for s in ("val", "test")})
        self._grid: Tensor | None = None  # first validation batch, (2 * n, C, H, W) in [0, 1]

    ##################################################################### losses and steps

    def forward(self, images: Tensor) -> Tensor:
        """Deterministic reconstruction (decode of the posterior mean)."""
        return self.vae.decode(self.vae.encode(images).latent_dist.mode()).sample

    def compute_losses(self, images: Tensor, sample: bool = True) -> VaeLosses:
        """Encodes, decodes a posterior sample (or the mean), and scores the reconstruction."""
        posterior = self.vae.encode(images).latent_dist
        z = posterior.sample() if sample else posterior.mode()
        rec = self.vae.decode(z).sample
        rec_loss = F.l1_loss(rec, images) if self.hparams.rec_loss == "l1" else F.mse_loss(rec, images)
        kl = posterior.kl().mean()  # KL summed over (C, h, w), averaged over images
        return VaeLosses(rec_loss + self.hparams.kl_weight * kl, rec_loss, kl, rec)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        out = self.compute_losses(batch[0], sample=True)
        self.log("train/loss", self.step_mean(out.loss, self.global_step), prog_bar=True, sync_dist=True)  # step mean
        self.log("train/rec_loss", out.rec_loss)
        self.log("train/kl", out.kl)
        return out.loss

    def _eval_step(self, batch: tuple[Tensor, Tensor], batch_idx: int, split: str) -> Tensor:
        images = batch[0]
        out = self.compute_losses(images, sample=False)  # the mean: a deterministic score
        self.rec_losses[split].update(out.rec_loss, weight=len(images))
        self.psnr[split].update(out.reconstruction.clamp(-1, 1), images)  # PSNR of the pooled MSE
        self.log(f"{split}/rec_loss", self.rec_losses[split], prog_bar=True)
        self.log(f"{split}/psnr", self.psnr[split], prog_bar=True)
        if split == "val" and batch_idx == 0:
            n = self.hparams.num_log_images
            pair = torch.cat([images[:n], out.reconstruction[:n]])  # originals row, reconstructions row
            self._grid = ((pair.detach().float().cpu() + 1) / 2).clamp(0, 1)
        return out.loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._eval_step(batch, batch_idx, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._eval_step(batch, batch_idx, "test")

    def on_validation_epoch_end(self) -> None:
        grid, self._grid = self._grid, None
        if grid is None or self.trainer.sanity_checking:
            return
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):  # other loggers have no add_image
                image = make_grid(grid, nrow=len(grid) // 2, padding=1)
                logger.experiment.add_image("val/reconstructions", image, self.global_step)

    def predict_step(self, batch: Tensor | tuple[Tensor, ...], batch_idx: int) -> Tensor:
        """Reconstructions ``(B, C, H, W)`` in [-1, 1]."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        return self(images).clamp(-1, 1)

    ##################################################################### optimizer

    def configure_optimizers(self) -> dict:
        hp = self.hparams
        opt = torch.optim.AdamW(self.vae.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        total = int(self.trainer.estimated_stepping_batches)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, hp.warmup_steps, total, hp.min_lr_ratio, hp.schedule)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "train/lr"}}

    ##################################################################### fit start / end

    def on_fit_start(self) -> None:
        if self.trainer.global_rank == 0 and not self.trainer.fast_dev_run:
            self.check_output_dir()
        # Register the key metric with the hparams plugin so runs compare in TensorBoard's HPARAMS tab.
        for logger in self.loggers:
            if isinstance(logger, TensorBoardLogger):
                declare_hparams(logger, dict(self.hparams), [self.key_metric])

    def default_output_dir(self) -> Path:
        """``output_dir``, else ``<run dir>/vae``."""
        if self.hparams.output_dir:
            return Path(self.hparams.output_dir)
        if self._trainer is None:
            raise RuntimeError("output_dir is None and the module is not attached to a Trainer: no run directory")
        return Path(trainer_run_dir(self.trainer)) / "vae"

    def run_dir(self) -> str:
        return str(Path(trainer_run_dir(self.trainer)).resolve())

    def check_output_dir(self) -> None:
        """Refuses, before training, to overwrite a VAE that another run saved (a latent cache may depend on it)."""
        path = self.default_output_dir()
        if not (path / "config.json").is_file() or self.hparams.overwrite_output:
            return
        owner_file = path / OWNER_FILE
        owner = json.loads(owner_file.read_text()).get("run_dir") if owner_file.is_file() else None
        if owner != self.run_dir():
            origin = f"saved by the run in {owner}" if owner else "not saved by this run"
            raise ValueError(
                f"model.init_args.output_dir={str(path)!r} already holds a VAE ({origin}); valid: another "
                "output_dir, resuming the run that saved it, or --model.init_args.overwrite_output=true"
            )

    def export(self, batches: Iterable[Tensor], output_dir: str | Path | None = None) -> Path:
        """Measures the scaling factor on ``batches``, stores it in the VAE config, and saves the VAE.

        Returns:
            The directory written (load it with `models.vae.load_vae`).
        """
        factor = compute_scaling_factor(self.vae, batches, self.hparams.scaling_images)
        if not math.isfinite(factor):
            raise ValueError(f"latent scaling factor is {factor}: the latents are constant or non-finite")
        self.vae.register_to_config(scaling_factor=factor)
        path = Path(output_dir) if output_dir is not None else self.default_output_dir()
        self.vae.save_pretrained(str(path))
        if self._trainer is not None:
            (path / OWNER_FILE).write_text(json.dumps({"run_dir": self.run_dir()}))
        return path

    def on_fit_end(self) -> None:
        trainer = self.trainer
        if trainer.fast_dev_run:
            rank_zero_info("fast_dev_run: the VAE is not exported")
            return
        if trainer.global_rank != 0:
            return
        loader = trainer.train_dataloader
        if loader is None:
            trainer.fit_loop.setup_data()
            loader = trainer.train_dataloader
        path = self.export(batch[0] for batch in loader)
        factor = self.vae.config.scaling_factor
        print(f"saved the VAE to {path} (scaling_factor={factor:.6g})")
        for logger in self.loggers:
            logger.log_metrics({"vae/scaling_factor": factor}, step=self.global_step)
