"""``diag/saturation``: the fraction of each DyT / Derf norm's point-wise inputs ``alpha x (+ s)`` beyond +-2, per site,
per attention QK-norm and for the readout, on a logging step's forward; and Derf's alpha and shift in the scales."""

from __future__ import annotations

import pytest
import torch

from experiments.monitoring.diagnostics import SATURATION_Z, Diagnostics, norm_scales, pointwise_norms
from models import Trunk, TrunkConfig
from models.norms import POINTWISE, Derf


def trunk_with(norm_layer: str, scheme: str = "pre") -> Trunk:
    cfg = TrunkConfig(dim=16, depth=2, num_heads=2, mlp="swiglu", mlp_hidden=32, norm_scheme=scheme,
                      norm_layer=norm_layer, qk_norm=True)  # fmt: skip
    trunk = Trunk(cfg)
    for i, m in enumerate(trunk.modules()):
        if isinstance(m, POINTWISE):
            m.alpha.data.fill_(0.5 + 0.5 * i)  # each its own alpha: from barely to mostly saturated
            if isinstance(m, Derf):
                m.shift.data.fill_(0.1 * i)
    return trunk


@pytest.mark.parametrize("scheme", ["pre", "siamese"])
@pytest.mark.parametrize("norm_layer", ["dyt", "derf"])
@torch.no_grad()
def test_saturated_fraction_of_every_pointwise_norm_is_the_hand_count(norm_layer: str, scheme: str):
    trunk = trunk_with(norm_layer, scheme)
    named = pointwise_norms(trunk)
    assert len(named) == sum(isinstance(m, POINTWISE) for m in trunk.modules())  # every one, each once
    assert "q_norm/block_1" in named and "k_norm/block_0" in named
    inputs = {}
    for name, m in named.items():
        m.register_forward_hook(lambda mod, args, out, name=name: inputs.__setitem__(name, args[0].clone()))
    diag = Diagnostics()
    diag.attach(trunk)
    trunk(4 * torch.randn(2, 6, 16))
    pending = diag.captured()
    diag.detach()
    for name, m in named.items():
        z = m.alpha * inputs[name] + (m.shift if isinstance(m, Derf) else 0.0)
        by_hand = (z.abs() > SATURATION_Z).sum().item() / z.numel()
        assert float(pending[f"diag/saturation/{name}"]) == pytest.approx(by_hand, abs=1e-7), name
    values = [float(pending[f"diag/saturation/{n}"]) for n in named]
    assert min(values) < max(values)  # the alphas differ, so do the fractions
    assert diag._handles == []


def test_derf_reports_alpha_and_shift():
    trunk = trunk_with("derf")
    stats = {k: float(v) for k, v in norm_scales(trunk).items()}
    own = trunk.blocks[1].mlp_res.norm
    assert stats["diag/alpha/norm/sublayer_3"] == pytest.approx(float(own.alpha))
    assert stats["diag/shift/norm/sublayer_3"] == pytest.approx(float(own.shift))


def test_no_pointwise_norm_no_saturation_hook():
    trunk = Trunk(TrunkConfig(dim=16, depth=1, num_heads=2, norm_layer="rmsnorm", qk_norm=True))
    diag = Diagnostics(residual_rms=False, max_activation=False)
    diag.attach(trunk)
    assert diag._handles == [] and pointwise_norms(trunk) == {}
