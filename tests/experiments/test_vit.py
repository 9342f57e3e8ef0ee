"""Image classification through the real CLI on the embedded images: the 2026 placements (LayerNorm Scaling,
OLMo 2's reordered norm, DyT stacked on a scheme) train a few steps (the LM and DiT tests run every scheme)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main

ROOT = Path(__file__).resolve().parents[2]


def vit_args(runs: Path, *configs: str) -> list[str]:
    """The tiny ViT at width 16, two blocks, batches of 8 of 32 training images."""
    stacked = [arg for cfg in configs for arg in ("-c", str(ROOT / cfg))]
    return [
        "fit", "-c", str(ROOT / "configs/vit/tiny.yaml"), *stacked, f"--runs_root={runs}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--model.init_args.trunk.dim=16", "--model.init_args.trunk.depth=2", "--model.init_args.trunk.num_heads=2",
        "--data.init_args.batch_size=8", "--data.init_args.limit_train=32", "--data.init_args.val_size=16",
        "--trainer.fast_dev_run=2",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "configs",
    [("configs/norm/lns.yaml",), ("configs/norm/reordered.yaml",),
     ("configs/norm/siamese.yaml", "configs/norm/dyt.yaml")],
    ids=["lns", "reordered", "siamese+dyt"],
)  # fmt: skip
def test_fast_dev_run_new_placements(configs: tuple[str, ...], tmp_path: Path):
    main(vit_args(tmp_path, *configs))
