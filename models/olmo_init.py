"""OLMo's initializations, from allenai/OLMo at commit 59a53e3f68e546330ca5a99ec626e58f9ab96494.

``init: mitchell`` with ``scaled_output_init: true`` (OLMo's ``InitFnType.mitchell``, OLMo-1B's ``init_fn``:
``configs/official-0724/OLMo-1B.yaml`` line 36; with ``scaled_output_init: false``, the plain-init baselines, the
output projections get ``1 / sqrt(d)`` like every other weight). Every weight is a normal truncated at
``+- cutoff * std`` with ``cutoff = init_cutoff_factor or 3.0`` (``olmo/initialization.py`` lines 8-22,
``init_normal``: ``trunc_normal_(w, 0, std, -cutoff * std, cutoff * std)``, biases zero), with ``d`` the model
width and ``layer_id`` the block's 0-based index (``olmo/model.py`` line 1115: ``OLMoBlock.build(i, ...) for i in
range(n_layers)``):

================================  ====================================  ===============================
tensor                            std                                   ``olmo/model.py``
================================  ====================================  ===============================
q / k / v (fused ``att_proj``)    ``1 / sqrt(d)``                       lines 707-726, 865-886
FFN input (``ff_proj``)           ``1 / sqrt(d)``                       lines 716-718, 726, 886
attention output ``attn_out``     ``1 / sqrt(2 d (layer_id + 1))``      lines 493-496, 505
FFN output ``ff_out``             ``1 / sqrt(2 h (layer_id + 1))``,     lines 493-496, 506 (``h`` is
                                  ``h = ff_out.in_features``            ``ff_out.in_features``, 452-462)
token embedding ``wte``           ``1 / sqrt(d)`` (no ``emb_init_std``) lines 1183-1185, 1196
LM head ``ff_out`` (untied)       ``1 / sqrt(d)``                       lines 1221-1223, 1230
norm weights / biases             1 / 0 (``reset_parameters``)          lines 190-194
================================  ====================================  ===============================

OLMo has no MoE or scheme-specific Linear; here every other trunk Linear (an MoE's router, DiT's adaLN) is an
input projection (``1 / sqrt(d)``), an MoE's expert input ``w_in`` too, and its expert output ``w_out`` (E, h, d)
is an ``ff_out`` with ``h`` the expert hidden size. A scheme's branch gain (DeepNorm's beta) still multiplies
after, as for every init; OLMo's own Pre-Norm has gain 1.

``init: olmo_normal`` is OLMo's ``InitFnType.normal`` with ``init_cutoff_factor: 3``, what OLMoE-1B-7B trains
with (allenai/OLMoE 357454f ``configs/OLMoE-1B-7B-0924.yml`` lines 37-39: ``init_fn: normal``, ``init_std: 0.02``,
``init_cutoff_factor: 3``): every weight, embedding and head included, ``init_std`` truncated at ``+- 3 init_std``
and no depth scaling (``olmo/model.py`` lines 489-491, 713-715, 1177-1182).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.init_values import trunc_normal_

CUTOFF = 3.0  # ``init_cutoff_factor or 3.0`` (olmo/model.py line 495); OLMoE's config sets 3 too


def olmo_normal_(w: Tensor, std: float, cutoff: float = CUTOFF, generator: torch.Generator | None = None) -> Tensor:
    """``init_normal``'s weight rule: ``trunc_normal_(w, 0, std, -cutoff * std, cutoff * std)`` (in place), drawn from
    ``generator`` (the global one if None) by inverse-CDF sampling (:func:`models.init_values.trunc_normal_`: the
    method of the torch OLMo trained with; one pass, no temporaries)."""
    return trunc_normal_(w, std, -cutoff * std, cutoff * std, generator)


def input_std(dim: int) -> float:
    """Mitchell std of an input projection (q, k, v, FFN input), the embedding and the LM head: ``1 / sqrt(d)``."""
    return 1.0 / math.sqrt(dim)


def output_std(fan_in: int, layer_id: int) -> float:
    """Mitchell std of block ``layer_id``'s (0-based) output projection with ``fan_in`` inputs:
    ``1 / sqrt(2 fan_in (layer_id + 1))`` (``attn_out``: fan_in = d; ``ff_out``: the FFN hidden size)."""
    return 1.0 / math.sqrt(2 * fan_in * (layer_id + 1))
