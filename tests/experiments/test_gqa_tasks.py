"""Every task trains with grouped-query attention: the LM through the real CLI with the shipped overlay
``configs/lm/gqa-tiny.yaml`` (one step), the ViT and the DiT through their Lightning modules' training step."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from experiments.cli import SaveConfigCallback, SuiteCLI
from experiments.tasks import ImageClassification, LatentDiffusion, OptimConfig
from models import TrunkConfig
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]


def test_the_lm_fits_a_step_with_the_shipped_gqa_overlay(tmp_path: Path):
    cli = SuiteCLI(
        args=["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/lm/gqa-tiny.yaml"),
              "-c", str(ROOT / "configs/norm/siamese.yaml"), f"--runs_root={tmp_path}",
              f"--trainer.default_root_dir={tmp_path}", f"--data.init_args.data_dir={tmp_path / 'data'}",
              "--trainer.fast_dev_run=1", *tiny_lm(), "--model.init_args.trunk.num_heads=4"],
        save_config_callback=SaveConfigCallback,
    )  # fmt: skip
    net = cli.model.net
    assert (net.cfg.num_heads, net.cfg.num_kv_heads) == (4, 2)
    assert net.trunk.blocks[0].attn.qkv.weight.shape == (32 + 2 * 2 * 8, 32)
    assert math.isfinite(float(cli.trainer.callback_metrics["train/loss"]))


def _train_step(module, batch) -> None:
    """One training step's forward and backward through the task's own ``training_step`` (its loss)."""
    module.train()
    before = module.net.trunk.blocks[0].attn.qkv.weight.detach().clone()
    loss = module.training_step(batch, 0)
    assert torch.isfinite(loss)
    loss.backward()
    qkv = module.net.trunk.blocks[0].attn.qkv.weight
    assert qkv.grad is not None and qkv.grad[32:].abs().sum() > 0  # the key and value rows learn
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    assert not torch.equal(qkv.detach(), before)


def test_the_vit_trains_a_step_with_gqa():
    trunk = TrunkConfig(dim=32, depth=2, num_heads=4, num_kv_heads=1, qk_norm=True, norm_scheme="siamese")
    module = ImageClassification(trunk, OptimConfig(), num_classes=3, img_size=8, patch_size=4)
    assert module.net.trunk.blocks[0].attn.qkv.weight.shape == (32 + 2 * 8, 32)
    _train_step(module, (torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 1])))


def test_the_dit_trains_a_step_with_gqa():
    trunk = TrunkConfig(dim=32, depth=2, num_heads=4, num_kv_heads=2, mlp="gelu_tanh", init="xavier",
                        norm_scheme="siamese_hybrid", adaln_zero_init=False)  # fmt: skip
    module = LatentDiffusion(trunk, OptimConfig(), num_classes=3, latent_size=4, latent_channels=4, patch_size=2,
                             learn_sigma=True, fid_samples=0, sample_grid_every_n_val=0)  # fmt: skip
    _train_step(module, (torch.randn(4, 4, 4, 4), torch.tensor([0, 1, 2, 1])))
