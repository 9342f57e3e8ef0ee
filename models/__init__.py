"""Plain-PyTorch models of the suite: norms, norm schemes, layers, the shared trunk, task networks.

Never imports lightning.
"""

from models.config import TrunkConfig
from models.dit import DiT
from models.lm import LanguageModel
from models.norms import NormLayer, build_norm, get_norm_layer
from models.presets import PRESETS, build_preset, count_params
from models.schemes import SCHEMES, NormScheme, TwoStream, get_scheme
from models.trunk import Block, Trunk
from models.vit import ViTClassifier

__all__ = [
    "PRESETS",
    "SCHEMES",
    "Block",
    "DiT",
    "LanguageModel",
    "NormLayer",
    "NormScheme",
    "Trunk",
    "TrunkConfig",
    "TwoStream",
    "ViTClassifier",
    "build_norm",
    "build_preset",
    "count_params",
    "get_norm_layer",
    "get_scheme",
]
