"""Generation metrics for the DiT task: InceptionV3 weights without downloads or unpickling, reference layouts.

Public API::

    resolve_fid_weights(path=None) -> FidWeights(state_dict_path, backend)
    build_feature_extractor(weights_path=None, feature=2048) -> FeatureExtractor(module, backend, ...)
    open_reference(path) -> Reference      # folder, image .npz, ADM reference batch, statistics .npz
    load_real_stats / save_real_stats      # the mu / sigma layout (+ this suite's optional features)
    build_fid_metric(...)                  # torchmetrics' FID over the same network
    metric_name(backend) -> "fid" | "fid_proxy"

The metrics themselves (FID, KID, precision / recall, IS) are in :mod:`experiments.evaluation.generation`.
Command line: ``python -m experiments fid REFERENCE SAMPLES [--weights PATH] [--batch-size N]``.
"""

from experiments.evaluation.fid.convert import FidWeightsLayoutError, convert_fid_helper_torchscript
from experiments.evaluation.fid.features import InceptionFeatures, has_classifier, load_inception_state_dict
from experiments.evaluation.fid.metric import (
    FeatureExtractor,
    ProxyFeatureExtractor,
    build_feature_extractor,
    build_fid_metric,
    metric_name,
)
from experiments.evaluation.fid.reference import Reference, open_reference
from experiments.evaluation.fid.stats import RealStats, load_real_stats, real_stats_path, save_real_stats
from experiments.evaluation.fid.weights import (
    FidBackend,
    FidWeights,
    locate_fid_helper_torchscript,
    resolve_fid_weights,
)

__all__ = [
    "FeatureExtractor",
    "FidBackend",
    "FidWeights",
    "FidWeightsLayoutError",
    "InceptionFeatures",
    "ProxyFeatureExtractor",
    "RealStats",
    "Reference",
    "build_feature_extractor",
    "build_fid_metric",
    "convert_fid_helper_torchscript",
    "has_classifier",
    "load_inception_state_dict",
    "load_real_stats",
    "locate_fid_helper_torchscript",
    "metric_name",
    "open_reference",
    "real_stats_path",
    "resolve_fid_weights",
    "save_real_stats",
]
