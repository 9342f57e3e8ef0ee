"""FID for the generative task (DESIGN.md section 5): weights without downloads, metric, stats cache, CLI.

Public API::

    resolve_fid_weights(path=None) -> FidWeights(state_dict_path, backend)
    build_fid_metric(weights_path=None, feature=2048, reset_real_features=False) -> (metric, backend)
    metric_name(backend) -> "fid" | "fid_proxy"
    compute_real_stats(images_iter, metric) -> RealStats(mu, sigma, num_samples)
    real_stats_for(path, metric, backend, images=None)  # load the cache, or compute + save it once

Command line: ``python -m experiments fid A B [--weights PATH] [--batch-size N] [--image-size 299]``.
"""

from experiments.evaluation.fid.convert import FidWeightsLayoutError, convert_fid_helper_torchscript
from experiments.evaluation.fid.metric import ProxyFeatureExtractor, build_fid_metric, metric_name
from experiments.evaluation.fid.stats import (
    RealStats,
    compute_real_stats,
    load_real_stats,
    real_stats_for,
    real_stats_path,
    save_real_stats,
    write_real_stats,
)
from experiments.evaluation.fid.weights import (
    FidBackend,
    FidWeights,
    locate_fid_helper_torchscript,
    resolve_fid_weights,
)

__all__ = [
    "FidBackend",
    "FidWeights",
    "FidWeightsLayoutError",
    "ProxyFeatureExtractor",
    "RealStats",
    "build_fid_metric",
    "compute_real_stats",
    "convert_fid_helper_torchscript",
    "load_real_stats",
    "locate_fid_helper_torchscript",
    "metric_name",
    "real_stats_for",
    "real_stats_path",
    "resolve_fid_weights",
    "save_real_stats",
    "write_real_stats",
]
