"""AutoencoderTraining and load_vae: learning, a Lightning run with export, save/load round trip, errors."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from diffusers import AutoencoderKL
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

from experiments.reliability.layout import TASK_NAMES
from experiments.tasks.vae import AutoencoderTraining, compute_scaling_factor
from models.vae import load_vae

TINY = dict(block_out_channels=[8, 16], norm_num_groups=4, latent_channels=4, img_size=16, warmup_steps=2)


def smooth_images(n: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    """Random but learnable images in [-1, 1]: low-frequency noise upsampled to ``size``."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, size // 4, size // 4, generator=g) * 2 - 1
    return torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


class TinyImages(L.LightningDataModule):
    def __init__(self, n: int = 48, batch_size: int = 8) -> None:
        super().__init__()
        self.data = TensorDataset(smooth_images(n), torch.zeros(n, dtype=torch.int64))
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)  # in order: the export sees known images

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch_size)


def test_task_name_and_key_metric():
    assert TASK_NAMES["AutoencoderTraining"] == AutoencoderTraining.task == "vae"
    assert AutoencoderTraining.key_metric == "val/rec_loss"


def test_latent_shape_and_loss_parts():
    model = AutoencoderTraining(**TINY, kl_weight=0.5)
    images = smooth_images(4)
    out = model.compute_losses(images, sample=False)
    posterior = model.vae.encode(images).latent_dist
    assert posterior.mean.shape == (4, 4, 8, 8)  # one halving with two blocks
    kl = 0.5 * (posterior.mean**2 + posterior.var - 1 - posterior.logvar).sum(dim=(1, 2, 3)).mean()
    torch.testing.assert_close(out.kl, kl)
    torch.testing.assert_close(out.rec_loss, (out.reconstruction - images).abs().mean())
    torch.testing.assert_close(out.loss, out.rec_loss + 0.5 * kl)


def test_few_steps_reduce_reconstruction_loss():
    model = AutoencoderTraining(**TINY)
    images = smooth_images(8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = model.compute_losses(images, sample=False).rec_loss.item()
    for _ in range(15):
        loss = model.compute_losses(images).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = model.compute_losses(images, sample=False).rec_loss.item()
    assert after < 0.8 * before, (before, after)  # about 0.42 -> 0.30


def test_fast_dev_run_does_not_export(tmp_path):
    model = AutoencoderTraining(**TINY, output_dir=str(tmp_path / "vae"))
    trainer = L.Trainer(fast_dev_run=True, accelerator="cpu", default_root_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(model, TinyImages())
    assert "train/loss" in trainer.callback_metrics and "val/psnr" in trainer.callback_metrics
    assert not (tmp_path / "vae").exists()


def test_fit_exports_vae_with_scaling_factor_and_logs_grid(tmp_path, capsys):
    data = TinyImages()
    model = AutoencoderTraining(**TINY, scaling_images=20, num_log_images=4)
    logger = TensorBoardLogger(tmp_path, name="vae", version="run")
    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=1,
        accelerator="cpu",
        logger=logger,
        enable_progress_bar=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, data)
    out_dir = tmp_path / "vae" / "run" / "vae"  # default output_dir: <run dir>/vae
    assert f"saved the VAE to {out_dir}" in capsys.readouterr().out
    stored = json.loads((out_dir / "config.json").read_text())["scaling_factor"]
    model.vae.eval()
    with torch.no_grad():  # 1 / std of the posterior means of the first 20 training images
        expected = 1.0 / model.vae.encode(data.data.tensors[0][:20]).latent_dist.mean.std().item()
    assert stored == pytest.approx(expected, rel=1e-5)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logger.log_dir))
    events.Reload()
    assert "val/reconstructions" in events.Tags()["images"]
    image = events.Images("val/reconstructions")[-1]
    assert (image.width, image.height) == (4 * 17 + 1, 2 * 17 + 1)  # 4 columns x (originals, reconstructions)


def test_scaling_factor_matches_hand_formula():
    model = AutoencoderTraining(**TINY)
    images = smooth_images(10)
    with torch.no_grad():
        expected = 1.0 / model.vae.encode(images[:7]).latent_dist.mean.std().item()
    batches = [images[:4], images[4:8], images[8:]]
    assert compute_scaling_factor(model.vae, batches, max_images=7) == pytest.approx(expected, rel=1e-5)
    assert model.vae.training  # the mode is restored


def test_export_load_round_trip(tmp_path):
    model = AutoencoderTraining(**TINY).eval()
    images = smooth_images(6)
    path = model.export([images], tmp_path / "vae")
    loaded = load_vae(str(path)).eval()
    assert isinstance(loaded, AutoencoderKL)
    with torch.no_grad():
        expected = 1.0 / model.vae.encode(images).latent_dist.mean.std().item()
        torch.testing.assert_close(loaded.encode(images).latent_dist.mean, model.vae.encode(images).latent_dist.mean)
        torch.testing.assert_close(
            loaded.decode(torch.ones(2, 4, 8, 8)).sample, model.vae.decode(torch.ones(2, 4, 8, 8)).sample
        )
    assert loaded.config.scaling_factor == pytest.approx(expected, rel=1e-5)
    assert loaded.config.scaling_factor != pytest.approx(0.18215)


def test_load_vae_missing_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match="does not exist") as err:
        load_vae(str(missing))
    assert str(missing) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "config, match",
    [({"_class_name": "UNet2DModel"}, "not an AutoencoderKL"), (None, "no config.json"), ("{broken", "not a valid")],
)
def test_load_vae_rejects_other_directories(tmp_path, config, match):
    if isinstance(config, dict):
        (tmp_path / "config.json").write_text(json.dumps(config))
    elif isinstance(config, str):
        (tmp_path / "config.json").write_text(config)
    with pytest.raises(ValueError, match=match) as err:
        load_vae(str(tmp_path))
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def test_load_vae_without_weights_is_one_line(tmp_path):
    AutoencoderTraining(**TINY).vae.save_config(tmp_path)  # config.json only, no weights
    with pytest.raises(ValueError, match="could not load") as err:
        load_vae(str(tmp_path))
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiples"):
        AutoencoderTraining(block_out_channels=[8, 12], norm_num_groups=8)
    with pytest.raises(ValueError, match="rec_loss"):
        AutoencoderTraining(**TINY, rec_loss="huber")


def test_a_vae_saved_by_another_run_is_not_overwritten(tmp_path):
    """A latent cache depends on the VAE it was encoded with: a second run refuses its output_dir at fit start."""
    out = tmp_path / "shared-vae"

    def fit(run: str, **extra) -> L.Trainer:
        model = AutoencoderTraining(**TINY, scaling_images=8, output_dir=str(out), **extra)
        trainer = L.Trainer(
            max_steps=1, limit_val_batches=0, accelerator="cpu", logger=TensorBoardLogger(tmp_path, "vae", run),
            enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(model, TinyImages(n=8))
        return trainer

    fit("first")
    assert json.loads((out / "written_by.json").read_text())["run_dir"].endswith("first")
    fit("first")  # the run that saved it may save it again (a resumed run)
    weights = (out / "diffusion_pytorch_model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="already holds a VAE") as err:
        fit("second")
    assert "overwrite_output" in str(err.value) and "\n" not in str(err.value)
    assert (out / "diffusion_pytorch_model.safetensors").read_bytes() == weights  # untouched
    fit("second", overwrite_output=True)
    assert json.loads((out / "written_by.json").read_text())["run_dir"].endswith("second")
