"""Generation metrics from Inception features: FID, KID, precision / recall, Inception Score.

One feature pass per image set feeds every metric::

    images --(batches of feature_batch_size)--> InceptionV3 --> FeatureSet
        sum, sum of outer products (float64)  -> mu, sigma -> FID
        pool features (float32, kept)         -> KID, precision / recall
        classifier logits (real weights only) -> IS
        pool features resampled (on request)  -> FID's spread at this sample count (fid_bootstrap_std)

The metrics themselves are torch-fidelity's (``fid_statistics_to_metric``, ``kid_features_to_metric``,
``prc_features_to_metric``, ``isc_features_to_metric``); nothing here re-implements them, except the FID
of resampled feature sets (:class:`FidToReference`, torch-fidelity has no resampling). Precision
and recall use k = 3 nearest neighbours, as ADM's evaluator (Kynkaanniemi et al., 2019); KID is the
unbiased polynomial-kernel MMD over 100 subsets (Binkowski et al., 2018). A reference given as stored
statistics only (ADM's ``mu``/``sigma``, a pytorch-fid file) scores FID; KID and precision / recall
then need its images (ADM's ``arr_0``) and are reported unavailable without them. No sFID: it has not
been checked against ADM's own evaluator here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from experiments.evaluation.fid.stats import RealStats

PR_NEIGHBOURHOOD = 3  # k of the k-NN manifolds, as ADM
KID_SUBSETS = 100
KID_SUBSET_SIZE = 1000  # torch-fidelity's default; smaller sets use their own size
IS_SPLITS = 10


@dataclass
class FeatureSet:
    """What one image set contributes to the metrics, accumulated batch by batch.

    The FID moments are float64 running sums (exact however the set is batched); the pool features
    are kept (N x D float32: 400 MB for 50k x 2048) for KID and precision / recall.
    """

    dim: int
    count: int = 0
    total: Tensor | None = None  # (D,) float64
    outer: Tensor | None = None  # (D, D) float64
    features: list[Tensor] = field(default_factory=list)
    logits: list[Tensor] = field(default_factory=list)

    def add(self, feats: Tensor, logits: Tensor | None = None) -> None:
        f = feats.detach().double().cpu()  # (B, D)
        self.total = f.sum(0) if self.total is None else self.total + f.sum(0)
        self.outer = f.T @ f if self.outer is None else self.outer + f.T @ f
        self.count += len(f)
        self.features.append(feats.detach().float().cpu())
        if logits is not None:
            self.logits.append(logits.detach().float().cpu())

    def stats(self) -> RealStats:
        """(mu, unbiased sigma, n) of the features."""
        if self.count < 2:
            raise ValueError(f"need at least 2 images for FID statistics, got {self.count}")
        mu = self.total / self.count
        sigma = (self.outer - self.count * torch.outer(mu, mu)) / (self.count - 1)
        return RealStats(mu.numpy(), sigma.numpy(), self.count)

    def stacked(self) -> Tensor:
        """All pool features, (N, D) float32."""
        return torch.cat(self.features) if self.features else torch.empty(0, self.dim)

    def stacked_logits(self) -> Tensor | None:
        return torch.cat(self.logits) if self.logits else None


def rebatch(batches: Iterable[Tensor], size: int) -> Iterator[Tensor]:
    """Cuts a stream of image batches of any size into batches of at most ``size`` (bounds Inception's memory)."""
    for batch in batches:
        for start in range(0, len(batch), size):
            yield batch[start : start + size]


@torch.no_grad()
def extract_features(
    batches: Iterable[Tensor],
    extractor: torch.nn.Module,
    *,
    batch_size: int = 50,
    total: int | None = None,
    desc: str = "features",
    device: torch.device | str = "cpu",
    progress: bool = True,
    report: Callable[[int, int | None], None] | None = None,
) -> FeatureSet:
    """Runs uint8 ``(B, 3, H, W)`` image batches through the extractor, ``batch_size`` at a time.

    Memory stays bounded by ``batch_size`` images inside InceptionV3 (about 20 MB of activations per
    image at 299 px on CPU), whatever the size of the incoming batches. The bar shows images/s;
    ``report``, if given, is called with (images done, ``total``) after each batch (a run's progress file).
    """
    with_logits = getattr(extractor, "logits", False)
    feature_set = FeatureSet(int(extractor.num_features))
    # The context closes the bar on an error too, so a one-line error starts its own line.
    with tqdm(total=total, desc=desc, unit="img", disable=not progress, dynamic_ncols=True, mininterval=1.0) as bar:
        for batch in rebatch(batches, batch_size):
            batch = batch.to(device)
            if with_logits:
                feats, logits = extractor.features_and_logits(batch)
            else:
                feats, logits = extractor(batch), None
            feature_set.add(feats, logits)
            bar.update(len(batch))
            if report is not None:
                report(feature_set.count, total)
    return feature_set


def fid_from_stats(real: RealStats, fake: RealStats) -> float:
    """FID = ||mu_r - mu_g||^2 + Tr(S_r + S_g - 2 (S_r S_g)^(1/2)), torch-fidelity's float64 implementation."""
    from torch_fidelity.metric_fid import KEY_METRIC_FID, fid_statistics_to_metric

    if real.mu.shape != fake.mu.shape:
        raise ValueError(f"reference statistics have {real.mu.shape[0]} features, the samples {fake.mu.shape[0]}")
    out = fid_statistics_to_metric({"mu": real.mu, "sigma": real.sigma}, {"mu": fake.mu, "sigma": fake.sigma}, False)
    return float(out[KEY_METRIC_FID])


class FidToReference:
    """FID of many feature sets against one reference, for resampling: ``Sigma_r^(1/2)`` is computed once.

    ``Tr (Sigma_r Sigma_g)^(1/2) = Tr (Sigma_r^(1/2) Sigma_g Sigma_r^(1/2))^(1/2)``, and with
    ``Sigma_g = C^T C / (N - 1)`` (``C`` the centred (N, D) features) the symmetric matrix inside is
    ``A^T A / (N - 1)`` for ``A = C Sigma_r^(1/2)``, whose nonzero eigenvalues are those of the (N, N) Gram matrix
    ``A A^T / (N - 1)``: one eigenproblem of the smaller side per set, in float64. The same number as
    :func:`fid_from_stats` (a test holds them to 1e-6 relative).
    """

    def __init__(self, real: RealStats) -> None:
        self.mu = np.asarray(real.mu, dtype=np.float64)
        self.sigma = np.asarray(real.sigma, dtype=np.float64)
        w, v = np.linalg.eigh(self.sigma)
        self.root = (v * np.sqrt(np.clip(w, 0, None))) @ v.T  # Sigma_r^(1/2), symmetric
        self.trace = float(np.trace(self.sigma))

    def __call__(self, features: np.ndarray, projected: np.ndarray | None = None) -> float:
        """``|mu_r - mu_g|^2 + Tr Sigma_r + Tr Sigma_g - 2 Tr (Sigma_r^(1/2) Sigma_g Sigma_r^(1/2))^(1/2)``.

        ``projected``: ``features @ Sigma_r^(1/2)`` if already at hand (rows of a projection made once for
        every resample: centring commutes with the product).
        """
        n, mu = len(features), features.mean(0)
        centred = features - mu
        projected = features @ self.root if projected is None else projected
        a = projected - projected.mean(0)  # = centred @ Sigma_r^(1/2)
        inner = a @ a.T if n <= a.shape[1] else a.T @ a  # same nonzero eigenvalues
        cross = np.sqrt(np.clip(np.linalg.eigvalsh(inner / (n - 1)), 0, None)).sum()
        mean_term = float(((self.mu - mu) ** 2).sum())
        return mean_term + self.trace + float((centred * centred).sum()) / (n - 1) - 2 * float(cross)


# Resamples ``fid --bootstrap`` may ask for: each costs one FID of N samples (seconds at 50k), and the std of
# 1,000 is within a few percent of its limit; 10,000 is already hours.
MAX_BOOTSTRAP = 10_000


def fid_bootstrap(real: RealStats, features: np.ndarray, draws: int, seed: int = 0) -> np.ndarray:
    """FID of ``draws`` resamples of the (N, D) sample features, each N drawn with replacement (seeded).

    Their standard deviation estimates how far the FID of N samples moves with the sample draw alone, the
    generator fixed: two models whose FIDs differ by less than that are not told apart by N samples. (A
    resample repeats images, so its FID sits above the full set's; the spread, not the level, is what it is for.)
    """
    if not 2 <= draws <= MAX_BOOTSTRAP:
        raise ValueError(f"fid bootstrap: {draws} resamples; valid: 2 or more, at most {MAX_BOOTSTRAP:,}")
    feats = np.asarray(features, dtype=np.float64)
    if feats.ndim != 2 or len(feats) < 2 or feats.shape[1] != len(real.mu):
        raise ValueError(f"fid bootstrap: features of shape {feats.shape}; valid: (N >= 2, {len(real.mu)})")
    fid = FidToReference(real)
    projected = feats @ fid.root  # once: a resample's projection is its rows of this
    rng = np.random.default_rng(seed)  # one resample's indices at a time: the same draws as one (draws, N) array
    return np.array([fid(feats[rows], projected[rows]) for rows in (rng.integers(0, len(feats), len(feats))
                                                                     for _ in range(draws))])  # fmt: skip


def kid(real: Tensor, fake: Tensor, seed: int = 2020) -> tuple[float, float, int]:
    """KID mean and std over subsets, and the subset size used (min(1000, both set sizes))."""
    from torch_fidelity.metric_kid import KEY_METRIC_KID_MEAN, KEY_METRIC_KID_STD, kid_features_to_metric

    size = min(KID_SUBSET_SIZE, len(real), len(fake))
    out = kid_features_to_metric(
        fake, real, kid_subsets=KID_SUBSETS, kid_subset_size=size, rng_seed=seed, verbose=False
    )
    return float(out[KEY_METRIC_KID_MEAN]), float(out[KEY_METRIC_KID_STD]), size


def precision_recall(
    real: Tensor, fake: Tensor, k: int = PR_NEIGHBOURHOOD, device: torch.device | str = "cpu"
) -> tuple[float, float]:
    """Improved precision (samples inside the real manifold) and recall (real inside the samples'), k-NN radii.

    The distances run on ``device`` (50k x 10k features: minutes on a GPU, much longer on a CPU).
    """
    from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL, prc_features_to_metric

    # save_cpu_ram: distances in (1000 x N) blocks instead of a full N x N matrix (10 GB at 50k).
    out = prc_features_to_metric(
        fake.to(device), real.to(device), prc_neighborhood=k, prc_batch_size=1000, save_cpu_ram=True, verbose=False
    )
    return float(out[KEY_METRIC_PRECISION]), float(out[KEY_METRIC_RECALL])


def inception_score(logits: Tensor, splits: int = IS_SPLITS) -> tuple[float, float]:
    """Mean and std over splits of exp(E KL(p(y|x) || p(y))), from the classifier logits."""
    from torch_fidelity.metric_isc import KEY_METRIC_ISC_MEAN, KEY_METRIC_ISC_STD, isc_features_to_metric

    out = isc_features_to_metric(logits, splits=splits)
    return float(out[KEY_METRIC_ISC_MEAN]), float(out[KEY_METRIC_ISC_STD])


@dataclass
class GenerationScores:
    """Every metric that could be computed, and why the others could not.

    Attributes:
        values: ``fid``, ``kid_mean``, ``kid_std``, ``precision``, ``recall``, ``is_mean``, ``is_std``
            (each ``<name>_proxy`` when the features are the proxy network's, which mean nothing outside one run).
        unavailable: metric -> reason, e.g. ``{"is": "the FID weights have no Inception classifier"}``.
        details: numbers the protocol records (``kid_subset_size``, ``pr_k``, counts).
    """

    values: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    details: dict[str, int | float | str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """One human-readable line per metric, unavailable ones with their reason."""
        out = [f"{name}: {value:.4f}" for name, value in self.values.items()]
        return out + [f"{name}: unavailable: {reason}" for name, reason in self.unavailable.items()]


def score_generation(
    samples: FeatureSet,
    reference_stats: RealStats,
    reference_features: Tensor | None,
    *,
    proxy: bool = False,
    is_unavailable: str | None = None,
    reference_has_images_note: str = "the reference has statistics only (no images or features)",
    device: torch.device | str = "cpu",
    bootstrap: int = 0,
) -> GenerationScores:
    """FID against the reference statistics; KID and precision / recall against its features; IS of the samples.

    Args:
        samples: the generated images' features (and logits when the extractor has a real classifier).
        reference_stats: the reference's (mu, sigma): ADM's stored ones, or computed from its images.
        reference_features: the reference's pool features for KID and P / R, or None (statistics only).
        proxy: the features come from the proxy network: names get ``_proxy``.
        is_unavailable: why IS cannot be computed (no classifier), or None when ``samples`` has logits.
        reference_has_images_note: the reason given when ``reference_features`` is None.
        device: where the precision / recall distances run.
        bootstrap: resamples of the samples for ``fid_bootstrap_std`` (:func:`fid_bootstrap`, seed 0); 0: none.
    """
    suffix = "_proxy" if proxy else ""
    scores = GenerationScores(details={"samples": samples.count, "pr_k": PR_NEIGHBOURHOOD})
    scores.values[f"fid{suffix}"] = fid_from_stats(reference_stats, samples.stats())
    fake = samples.stacked()
    if bootstrap:
        resampled = fid_bootstrap(reference_stats, fake.numpy(), bootstrap)
        scores.values[f"fid_bootstrap_std{suffix}"] = float(resampled.std(ddof=1))
        scores.details["fid_bootstrap_draws"] = bootstrap
    if reference_features is None:
        scores.unavailable["kid"] = scores.unavailable["precision_recall"] = reference_has_images_note
    elif min(len(reference_features), len(fake)) <= PR_NEIGHBOURHOOD:
        scores.unavailable["kid"] = scores.unavailable["precision_recall"] = (
            f"need more than {PR_NEIGHBOURHOOD} images per side, have {len(reference_features)} / {len(fake)}"
        )
    else:
        mean, std, size = kid(reference_features, fake)
        scores.values[f"kid_mean{suffix}"], scores.values[f"kid_std{suffix}"] = mean, std
        scores.details["kid_subset_size"] = size
        precision, recall = precision_recall(reference_features, fake, device=device)
        scores.values[f"precision{suffix}"], scores.values[f"recall{suffix}"] = precision, recall
    logits = samples.stacked_logits()
    if logits is None or is_unavailable is not None:
        scores.unavailable["is"] = is_unavailable or "no classifier logits were extracted"
    elif len(logits) < IS_SPLITS:
        scores.unavailable["is"] = f"need at least {IS_SPLITS} samples for {IS_SPLITS} splits, have {len(logits)}"
    else:
        scores.values["is_mean"], scores.values["is_std"] = inception_score(logits)
    return scores


def score_against(
    reference,
    sample_batches: Iterable[Tensor],
    extractor,
    *,
    num_samples: int | None = None,
    batch_size: int = 50,
    device: torch.device | str = "cpu",
    progress: bool = True,
    bootstrap: int = 0,
    report: Callable[[int, int | None], None] | None = None,
) -> tuple[GenerationScores, FeatureSet | None]:
    """Scores generated images against a reference opened by :func:`experiments.evaluation.fid.open_reference`.

    FID uses the reference's stored statistics when it has them (ADM, statistics files), else those of
    its images; KID and precision / recall use its stored features or its images' features.

    Args:
        reference: the opened reference.
        sample_batches: uint8 (B, 3, H, W) batches of the generated images.
        extractor: a :class:`experiments.evaluation.fid.metric.FeatureExtractor`.
        num_samples: for the progress bar.
        batch_size: images per InceptionV3 pass (bounds memory).
        device: where InceptionV3 runs.
        progress: show bars with images/s.
        bootstrap: resamples of the samples for FID's spread at their count (0: none).
        report: called with (samples' features done, num_samples) after each batch of the samples.

    Returns:
        The scores, and the reference's computed feature set (None when nothing was computed for it).
    """
    from experiments.evaluation.fid.stats import same_feature_space

    if not same_feature_space(reference.backend, extractor.backend):
        raise ValueError(
            f"{reference.path}: made with backend {reference.backend!r}, not comparable with {extractor.backend!r}; "
            "valid: statistics of the same feature network"
        )
    common = dict(batch_size=batch_size, device=device, progress=progress)
    computed = None
    if reference.images is not None and (reference.stats is None or reference.features is None):
        batches, total = reference.images.batches(batch_size), len(reference.images)
        computed = extract_features(batches, extractor.module, total=total, desc="reference", **common)
    stats = reference.stats if reference.stats is not None else computed.stats()
    if reference.features is not None:
        ref_features = torch.from_numpy(reference.features)
    else:
        ref_features = computed.stacked() if computed is not None else None
    samples = extract_features(
        sample_batches, extractor.module, total=num_samples, desc="sample features", report=report, **common
    )
    scores = score_generation(
        samples,
        stats,
        ref_features,
        proxy=extractor.proxy,
        is_unavailable=extractor.is_unavailable,
        device=device,
        bootstrap=bootstrap,
    )
    scores.details["reference_images"] = reference.image_count
    return scores, computed
