"""The latent cache: encode_latents writes it, LatentDataModule reads it back exactly."""

from __future__ import annotations

import json
import os
import re
import signal
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import datamodules.latents.encode as encode_latents
from datamodules.images.embedded import load_embedded_images, resize_uint8
from datamodules.latents.cache import LatentShards, read_latent_meta
from datamodules.latents.datamodule import LatentDataModule
from datamodules.latents.encode import main
from models.vae import build_vae, load_vae

SCALE = 0.7
LIMIT = 40


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    """A tiny random AutoencoderKL (16 px -> 4x8x8) saved with a known scaling factor."""
    torch.manual_seed(0)
    vae = build_vae([8, 16], layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16)
    vae.register_to_config(scaling_factor=SCALE)
    path = tmp_path_factory.mktemp("vae")
    vae.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def embedded_images():
    """The first LIMIT embedded train images as uint8 (N, 3, 16, 16), and their labels."""
    train = load_embedded_images("train")
    images = resize_uint8(torch.from_numpy(train.images[:LIMIT].copy()).unsqueeze(1), 16).expand(-1, 3, -1, -1)
    return images, torch.from_numpy(train.labels[:LIMIT])


@torch.no_grad()
def reference_latents(vae_dir, images: torch.Tensor) -> torch.Tensor:
    """Posterior means of uint8 images mapped to [-1, 1], times the scaling factor."""
    vae = load_vae(str(vae_dir)).eval()
    return vae.encode(images.float() / 127.5 - 1).latent_dist.mean * SCALE


def encode(vae_dir, out, *extra: str) -> int:
    argv = ["--vae", str(vae_dir), "--out", str(out), "--image-size", "16", "--limit", str(LIMIT)]
    return main([*argv, "--batch-size", "12", "--shard-size", "16", *extra])


@pytest.fixture(scope="module")
def cache32(vae_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "f32"
    assert encode(vae_dir, out, "--dtype", "float32") == 0
    return out


def stacked(shards: LatentShards, flipped: bool = False) -> torch.Tensor:
    return torch.from_numpy(np.stack([shards.latent(i, flipped) for i in range(len(shards))]))


def test_round_trip_float32(cache32, vae_dir, embedded_images):
    images, labels = embedded_images
    shards = LatentShards(cache32)
    torch.testing.assert_close(stacked(shards), reference_latents(vae_dir, images), atol=1e-5, rtol=1e-5)
    flipped = reference_latents(vae_dir, torch.flip(images, dims=[-1]))
    torch.testing.assert_close(stacked(shards, flipped=True), flipped, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(flipped, stacked(shards))  # the flip changes the latents
    np.testing.assert_array_equal(shards.labels, labels.numpy())


def test_meta_and_shards(cache32, vae_dir):
    meta = read_latent_meta(cache32)
    assert (meta.count, meta.num_classes, meta.latent_shape, meta.flip) == (LIMIT, 10, [4, 8, 8], True)
    assert meta.scaling_factor == pytest.approx(SCALE) and meta.vae_path == str(vae_dir.resolve())
    assert [s["count"] for s in meta.shards] == [16, 16, 8]  # batches of 12 straddle shard boundaries
    tag = meta.shards[0]["latents"].split("_")[1]  # the settings' hash names the files
    assert meta.shards[1] == {
        "latents": f"latents_{tag}_00001.npy", "latents_flip": f"latents_flip_{tag}_00001.npy",
        "labels": f"labels_{tag}_00001.npy", "count": 16,
    }  # fmt: skip
    assert np.load(cache32 / f"latents_{tag}_00002.npy", allow_pickle=False).shape == (8, 4, 8, 8)
    assert np.load(cache32 / f"latents_{tag}_00000.npy", allow_pickle=False).dtype == np.float32
    assert not list(cache32.glob("*.tmp*")) and not (cache32 / "encoding.json").exists()


def test_float16_default_round_trip(vae_dir, embedded_images, tmp_path):
    images, _ = embedded_images
    encode(vae_dir, tmp_path / "f16")
    shards = LatentShards(tmp_path / "f16")
    assert np.load(tmp_path / "f16" / shards.meta.shards[0]["latents"], allow_pickle=False).dtype == np.float16
    torch.testing.assert_close(stacked(shards), reference_latents(vae_dir, images), atol=2e-3, rtol=2e-3)


def test_datamodule_split_and_batches(cache32, vae_dir):
    dm = LatentDataModule(str(cache32), batch_size=8, val_fraction=0.25, seed=1)
    assert (dm.num_classes, dm.latent_size, dm.latent_channels) == (10, 8, 4)
    assert dm.scaling_factor == pytest.approx(SCALE) and dm.vae_path == str(vae_dir.resolve())
    assert len(dm.class_names) == 10 and dm.source_name in ("fashion-mnist", "sklearn-digits")
    assert dm.source_image_size == 16
    dm.setup("fit")
    train, val = dm.train_index, dm.val_index
    assert len(val) == 10 and len(set(train) | set(val)) == LIMIT and not set(train) & set(val)
    again = LatentDataModule(str(cache32), val_fraction=0.25, seed=1)
    again.setup("fit")
    np.testing.assert_array_equal(again.val_index, val)
    other = LatentDataModule(str(cache32), val_fraction=0.25, seed=2)
    other.setup("fit")
    assert not np.array_equal(other.val_index, val)

    latents, labels = next(iter(dm.train_dataloader()))
    assert latents.dtype == torch.float32 and latents.shape == (8, 4, 8, 8) and labels.dtype == torch.int64
    shards = dm.shards
    val_latents, val_labels = next(iter(dm.val_dataloader()))  # never flipped, in row order
    torch.testing.assert_close(val_latents, torch.from_numpy(np.stack([shards.latent(i) for i in val[:8]])))
    np.testing.assert_array_equal(val_labels.numpy(), shards.labels[val[:8]])
    seen = set()
    for i in range(len(train)):  # every train item is its row's latent in one of the two orientations
        latent, label = dm.train_dataloader().dataset[i]
        row = train[i]
        assert label.item() == shards.labels[row]
        is_flipped = torch.equal(latent, torch.from_numpy(shards.latent(row, flipped=True)))
        assert is_flipped or torch.equal(latent, torch.from_numpy(shards.latent(row)))
        seen.add(is_flipped)
    assert seen == {True, False}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_rerun_skips_and_other_settings_refuse(vae_dir, tmp_path, capsys):
    out = tmp_path / "cache"
    encode(vae_dir, out)
    old_files = sorted(p.name for p in out.iterdir())
    stamp = (out / "meta.json").stat().st_mtime_ns
    capsys.readouterr()
    assert encode(vae_dir, out) == 0
    assert "cache exists" in capsys.readouterr().out
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    assert encode(vae_dir, out, "--no-flip") == 2
    assert "flip" in one_error_line(capsys) and sorted(p.name for p in out.iterdir()) == old_files
    assert encode(vae_dir, out, "--no-flip", "--overwrite") == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["flip"] is False and meta["shards"][0]["latents_flip"] is None
    # The replaced cache's files are gone; only the new cache's files and meta.json remain.
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["meta.json", *(s[k] for s in meta["shards"] for k in ("latents", "labels"))]
    )
    dm = LatentDataModule(str(out), batch_size=4)  # no flips: train items are the plain latents
    dm.setup("fit")
    latent, _ = dm.train_dataloader().dataset[0]
    torch.testing.assert_close(latent, torch.from_numpy(dm.shards.latent(int(dm.train_index[0]))))


def test_sample_is_seeded_per_row(vae_dir, tmp_path, cache32):
    encode(vae_dir, tmp_path / "a", "--sample", "--dtype", "float32", "--no-flip")
    encode(vae_dir, tmp_path / "b", "--sample", "--dtype", "float32", "--no-flip", "--batch-size", "5")
    a, b = LatentShards(tmp_path / "a"), LatentShards(tmp_path / "b")
    torch.testing.assert_close(stacked(a), stacked(b))  # the same noise per image, however it is batched
    assert not torch.allclose(stacked(a), stacked(LatentShards(cache32)), atol=1e-3)


def test_command_errors_are_one_line(vae_dir, tmp_path, capsys):
    out = ["--out", str(tmp_path / "out")]
    assert main(["--vae", str(tmp_path / "no-vae"), *out]) == 2
    assert "does not exist" in one_error_line(capsys)
    assert main(["--vae", str(vae_dir), *out, "--image-folder", str(tmp_path / "no-images")]) == 2
    assert "not a directory" in one_error_line(capsys)
    assert main(["--vae", str(vae_dir), *out, "--image-size", "15", "--limit", "2"]) == 2
    assert "multiple" in one_error_line(capsys)
    with pytest.raises(SystemExit) as exit_info:  # argparse errors: one line too, status 2
        main(["--vae", str(vae_dir), *out, "--batch-size", "0"])
    assert exit_info.value.code == 2 and "--batch-size 0" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_refuses_a_directory_that_is_not_a_latent_cache(vae_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):  # not even --overwrite replaces what is not a latent cache
        assert encode(vae_dir, out, *extra) == 2
        assert "is not a latent cache" in one_error_line(capsys)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_info:  # found while parsing the options, before the VAE loads
        encode(vae_dir, tmp_path / "file")
    assert exit_info.value.code == 2
    line = one_error_line(capsys)
    assert f"--out {tmp_path / 'file'} is a file, not a directory (command line); valid: a directory path\n" in line


def test_sigterm_keeps_the_encoded_part_and_the_rerun_resumes(vae_dir, tmp_path, cache32, monkeypatch, capsys):
    calls = {"n": 0}
    real = encode_latents.encode_batch

    def encode_then_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the plain and the mirrored half of batch 2: a real SIGTERM in between
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(encode_latents, "encode_batch", encode_then_signal)
    out = tmp_path / "resumed"
    assert encode(vae_dir, out, "--dtype", "float32") == 128 + signal.SIGTERM
    assert "rerun the same command to resume" in capsys.readouterr().out
    progress = json.loads((out / "encoding.json").read_text())
    assert progress["done"] == 24 and [s["count"] for s in progress["shards"]] == [16, 8]  # batch 2 was finished
    assert not (out / "meta.json").exists()
    monkeypatch.setattr(encode_latents, "encode_batch", real)
    assert encode(vae_dir, out, "--dtype", "float32") == 0
    meta = read_latent_meta(out)
    assert [s["count"] for s in meta.shards] == [16, 8, 16] and not (out / "encoding.json").exists()
    resumed, whole = LatentShards(out), LatentShards(cache32)
    torch.testing.assert_close(stacked(resumed), stacked(whole), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(stacked(resumed, True), stacked(whole, True), atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(resumed.labels, whole.labels)


@pytest.mark.parametrize("name", ["../outside.npy", "/etc/passwd", "sub/x.npy", "x.txt", 7])
def test_meta_json_cannot_point_outside_the_cache(cache32, tmp_path, name):
    bad = tmp_path / "bad"
    bad.mkdir()
    for path in cache32.iterdir():
        (bad / path.name).write_bytes(path.read_bytes())
    meta = json.loads((bad / "meta.json").read_text())
    meta["shards"][1]["labels"] = name
    (bad / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"shards\[1\]\.labels") as err:
        LatentDataModule(str(bad))
    assert "meta.json" in str(err.value) and "\n" not in str(err.value)


def test_meta_json_cannot_escape_through_a_symlink(cache32, tmp_path):
    bad = tmp_path / "linked"
    bad.mkdir()
    for path in cache32.iterdir():
        (bad / path.name).write_bytes(path.read_bytes())
    name = read_latent_meta(bad).shards[0]["labels"]
    (tmp_path / "elsewhere.npy").write_bytes((bad / name).read_bytes())
    (bad / name).unlink()
    (bad / name).symlink_to(tmp_path / "elsewhere.npy")
    with pytest.raises(ValueError, match="inside"):
        read_latent_meta(bad)


def test_missing_cache_tells_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m datamodules.latents.encode") as err:
        LatentDataModule(str(tmp_path / "nope"))
    assert "does not exist" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        LatentDataModule(str(tmp_path))


def test_image_folder_center_crop(vae_dir, tmp_path):
    rng = np.random.default_rng(0)
    sizes = {"cat": [(40, 24), (16, 16)], "dog": [(20, 70)]}  # (width, height)
    for cls, whs in sizes.items():
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for k, (w, h) in enumerate(whs):
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "imgs" / cls / f"{k}.png")
    out = tmp_path / "cache"
    main(["--vae", str(vae_dir), "--out", str(out), "--image-folder", str(tmp_path / "imgs"), "--image-size", "16"]
         + ["--dtype", "float32"])  # fmt: skip
    meta = read_latent_meta(out)
    assert (meta.count, meta.class_names, meta.source) == (3, ["cat", "dog"], "image-folder")
    assert meta.source_name == str((tmp_path / "imgs").resolve())  # FID reads reference images from it
    shards = LatentShards(out)
    np.testing.assert_array_equal(shards.labels, [0, 0, 1])
    # 40x24 -> bicubic to 27x16 (short side 16) -> center columns 5:21.
    image = Image.open(tmp_path / "imgs" / "cat" / "0.png").convert("RGB").resize((27, 16), Image.BICUBIC)
    crop = torch.from_numpy(np.array(image)[:, 5:21]).permute(2, 0, 1)[None]  # (1, 3, 16, 16)
    torch.testing.assert_close(torch.from_numpy(shards.latent(0)[None]), reference_latents(vae_dir, crop))
    # 20x70: 70 >= 2 * 16 is false for the short side 20, so only bicubic 16x56, center rows 20:36.
    image = Image.open(tmp_path / "imgs" / "dog" / "0.png").convert("RGB").resize((16, 56), Image.BICUBIC)
    crop = torch.from_numpy(np.array(image)[20:36]).permute(2, 0, 1)[None]
    torch.testing.assert_close(torch.from_numpy(shards.latent(2)[None]), reference_latents(vae_dir, crop))


def test_ranks_reading_different_latent_caches_are_refused_at_setup(cache32, tmp_path, monkeypatch):
    """Rank 0 read the cache; this rank (1 of 2, all_gather faked) reads a copy whose one latent was re-encoded:
    one line naming both. The unchanged copy is taken."""
    import shutil

    import datamodules.fingerprint as fp
    from datamodules.latents.cache import META_FILE

    copy = tmp_path / "f32"
    shutil.copytree(cache32, copy)
    meta = read_latent_meta(copy)
    names = [META_FILE, *(s[k] for s in meta.shards for k in ("latents", "latents_flip", "labels") if s.get(k))]
    rank0 = {"rank": 0, "host": "node-a", "what": f"latent cache {cache32}",
             "fingerprint": fp.files_fingerprint(cache32, names)}  # fmt: skip
    monkeypatch.setattr(fp, "_world", lambda: 2)
    monkeypatch.setattr(fp.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(fp.dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), [rank0, mine]))
    LatentDataModule(str(copy)).setup("fit")  # the same bytes: taken
    first = copy / meta.shards[0]["latents"]
    latents = np.load(first, allow_pickle=False)
    latents[3] += 1
    np.save(first, latents)
    says = r"^the ranks read different data: rank 0 on node-a read latent cache .*f32 \(fingerprint [0-9a-f]{12}\), "
    with pytest.raises(ValueError, match=says + r"rank 1 on .* read latent cache .*f32 \(fingerprint"):
        LatentDataModule(str(copy)).setup("fit")


def test_a_global_batch_sets_the_trainers_accumulation(cache32):
    """256 latents per step from micro-batches of 4 on 2 data-parallel ranks: 2 accumulated micro-batches."""
    dm = LatentDataModule(str(cache32), batch_size=4, global_batch_size=16)
    dm.trainer = SimpleNamespace(distributed_sampler_kwargs={"num_replicas": 2, "rank": 0}, accumulate_grad_batches=1)
    dm.setup("fit")
    assert dm.trainer.accumulate_grad_batches == 2 and dm.train_dataloader().batch_size == 4
    with pytest.raises(ValueError, match=re.escape("global_batch_size=10 is not a multiple of the per-device")):
        LatentDataModule(str(cache32), batch_size=4, global_batch_size=10)
