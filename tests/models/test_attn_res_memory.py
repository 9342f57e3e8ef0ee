"""Attention Residuals keep each source once: what backward keeps grows linearly in depth.

Counted with ``saved_tensors_hooks``: the bytes of every distinct storage the autograd graph keeps after the
forward (a source kept by several sublayers counts once, as memory does). Linear means the same increment per
layer from depth 4 to 8 as from 8 to 16, exactly. The earlier form, which concatenated the blocks into a new
``(K + 1, B, N, D)`` tensor at every block, kept one such tensor per block: 680,192 then 876,800 bytes per layer
(Full AttnRes, dim 64, 32 tokens, default ``recompute_norms``), and 139,776 then 238,080 under activation
checkpointing.
"""

from __future__ import annotations

import pytest
import torch

from models import TrunkConfig
from models.trunk import Trunk


def saved_bytes(depth: int, scheme: str, **options) -> int:
    torch.manual_seed(0)
    cfg = TrunkConfig(dim=64, depth=depth, num_heads=2, mlp="swiglu", norm_layer="rmsnorm", norm_scheme=scheme,
                      **options)  # fmt: skip
    trunk = Trunk(cfg)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = trunk(torch.randn(2, 16, 64, requires_grad=True))
    assert out.requires_grad
    return sum(kept.values())


@pytest.mark.parametrize("scheme", ["attn_res", "block_attn_res"])
@pytest.mark.parametrize("options", [{}, {"activation_checkpointing": True}], ids=["recompute-auto", "checkpointed"])
def test_saved_activations_grow_linearly_in_depth(scheme: str, options: dict):
    b4, b8, b16 = (saved_bytes(d, scheme, **options) for d in (4, 8, 16))
    assert (b8 - b4) / 4 == (b16 - b8) / 8, (b4, b8, b16)


def test_attn_res_keeps_no_more_than_pre_norm_when_recomputed():
    """With the prologue recomputed, Full AttnRes keeps no more than Pre-Norm at depth 16 (its sources replace the
    residual stream's saved norm inputs)."""
    assert saved_bytes(16, "attn_res") <= saved_bytes(16, "pre")
