"""OLMo's Mitchell init (``init: mitchell``) and OLMoE's truncated normal (``init: olmo_normal``) in float64,
every parameter against a rule written here from OLMo's equations (allenai/OLMo 59a53e3, ``olmo/model.py``
``reset_parameters``; see models/olmo_init.py), not from the suite's code:

* q / k / v, FFN input, router, expert input, embedding, LM head: N(0, 1/sqrt(d)) truncated at +-3 std;
* block l's attention output: 1/sqrt(2 d (l + 1)); its FFN output: 1/sqrt(2 h (l + 1)), h = the FFN hidden size;
* norm weights exactly 1, biases exactly 0.

A std is checked statistically: the sample std of a normal truncated at +-3 sigma is sigma * 0.98658 (the
truncated normal's variance, below); its relative standard error is about 0.69 / sqrt(n) (kurtosis 2.9), and
the smallest tensor here (the 64-expert router, n = 16,384) gives 0.54 %, so a 3 % tolerance is > 5 standard
errors and still catches any factor sqrt(2) / layer-index
mistake (the smallest, l + 1 vs l + 2 at l = 3, is 11 %). Truncation is checked exactly: every |w| <= 3 std,
and some |w| > 2.5 std (not a tighter cut).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from models import LanguageModel, TrunkConfig
from models.schemes import NormScheme, get_scheme

D, H, DEPTH, VOCAB, MOE_H, EXPERTS = 256, 512, 4, 512, 32, 64
TOL = 0.03


def truncated_std_factor(c: float = 3.0) -> float:
    """std of N(0, 1) truncated to [-c, c]: sqrt(1 - 2 c phi(c) / (2 Phi(c) - 1))."""
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(c / math.sqrt(2))  # 2 Phi(c) - 1
    return math.sqrt(1 - 2 * c * phi / mass)


def olmo_rule(name: str, moe: bool) -> float | str:
    """OLMo's std of one parameter of the LM, or "ones" / "zeros" (hand-written from its reset_parameters)."""
    if name.endswith(".bias"):
        return "zeros"
    if re.search(r"norm.*\.weight$|\.scale$", name):
        return "ones"
    if m := re.fullmatch(r"trunk\.blocks\.(\d+)\.attn\.proj\.weight", name):
        return 1 / math.sqrt(2 * D * (int(m[1]) + 1))  # attn_out
    if m := re.fullmatch(r"trunk\.blocks\.(\d+)\.mlp\.(fc2\.weight|experts\.w_out)", name):
        return 1 / math.sqrt(2 * (MOE_H if moe else H) * (int(m[1]) + 1))  # ff_out
    if re.fullmatch(r"embed\.weight|head\.weight|trunk\.blocks\.\d+\.(attn\.qkv|mlp\.fc1|mlp\.router)\.weight", name):
        return 1 / math.sqrt(D)
    if re.fullmatch(r"trunk\.blocks\.\d+\.mlp\.experts\.w_in", name):
        return 1 / math.sqrt(D)
    raise AssertionError(f"no OLMo rule for {name}")


def check_truncated(w: torch.Tensor, std: float, name: str) -> None:
    assert w.dtype == torch.float64, name
    assert w.abs().max().item() <= 3 * std, f"{name}: beyond the +-3 std cut"
    assert w.abs().max().item() > 2.5 * std, f"{name}: cut tighter than 3 std"
    assert abs(w.mean().item()) < 5 * std / math.sqrt(w.numel()), name  # 5 standard errors of the mean
    measured = w.std().item() / (std * truncated_std_factor())
    assert measured == pytest.approx(1.0, abs=TOL), f"{name}: std {w.std().item():.5g}, expected {std:.5g}"


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_mitchell_init_matches_olmo_tensor_by_tensor(moe: bool):
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        extra = dict(moe_experts=EXPERTS, moe_top_k=2, moe_hidden=MOE_H) if moe else {}
        cfg = TrunkConfig(dim=D, depth=DEPTH, num_heads=4, mlp="swiglu", mlp_hidden=H, norm_layer="rmsnorm",
                          qk_norm=True, bias=not moe, init="mitchell", scaled_output_init=True, **extra)  # fmt: skip
        net = LanguageModel(cfg, vocab_size=VOCAB, max_seq_len=16)
    finally:
        torch.set_default_dtype(default)
    assert truncated_std_factor() == pytest.approx(0.98658, abs=1e-5)
    seen = 0
    for name, p in net.named_parameters():
        rule = olmo_rule(name, moe)
        if rule == "zeros":
            assert (p == 0).all(), name
        elif rule == "ones":
            assert (p == 1).all(), name
        else:
            check_truncated(p.detach(), rule, name)
        seen += 1
    assert seen > 6 * DEPTH


@pytest.mark.parametrize("scheme", [s.value for s in NormScheme])
def test_mitchell_scales_every_schemes_output_projections_by_layer(scheme: str):
    """The rule reaches every scheme's trunk: output projections at 1/sqrt(2 fan_in (l + 1)) times the scheme's
    branch gain (DeepNorm's beta), inputs at 1/sqrt(d)."""
    torch.manual_seed(0)
    cfg = TrunkConfig(dim=128, depth=3, num_heads=2, mlp="swiglu", mlp_hidden=384, norm_scheme=scheme,
                      init="mitchell", scaled_output_init=True)  # fmt: skip
    net = LanguageModel(cfg, vocab_size=64, max_seq_len=8)
    gain = get_scheme(scheme).branch_init_gain(3)
    for layer, block in enumerate(net.trunk.blocks):
        for w, fan_in in ((block.attn.proj.weight, 128), (block.mlp.fc2.weight, 384)):
            std = gain / math.sqrt(2 * fan_in * (layer + 1))
            assert w.abs().max().item() <= 3 * std * (1 + 1e-6)
            assert w.std().item() / (std * truncated_std_factor()) == pytest.approx(1.0, abs=0.06)
        fc1 = block.mlp.fc1.weight
        assert fc1.abs().max().item() <= 3 * gain / math.sqrt(128) * (1 + 1e-6)


def test_olmo_normal_is_olmoes_truncated_init_without_depth_scaling():
    torch.manual_seed(0)
    cfg = TrunkConfig(dim=D, depth=2, num_heads=4, mlp="swiglu", mlp_hidden=H, init="olmo_normal", init_std=0.02)
    net = LanguageModel(cfg, vocab_size=VOCAB, max_seq_len=8)
    for name in ("embed.weight", "head.weight", "trunk.blocks.1.attn.proj.weight", "trunk.blocks.1.mlp.fc2.weight"):
        w = dict(net.named_parameters())[name].detach().double()
        check_truncated(w, 0.02, name)


def test_mitchell_without_output_scaling_is_plain_one_over_sqrt_d():
    """The plain-init baselines (pre-plain-init, lns) on a Mitchell config: every weight 1/sqrt(d), no layer scaling."""
    torch.manual_seed(0)
    cfg = TrunkConfig(dim=D, depth=3, num_heads=4, mlp="swiglu", mlp_hidden=H, init="mitchell")
    net = LanguageModel(cfg, vocab_size=VOCAB, max_seq_len=8)
    for name in ("trunk.blocks.0.attn.proj.weight", "trunk.blocks.2.attn.proj.weight", "trunk.blocks.2.mlp.fc2.weight"):
        check_truncated(dict(net.named_parameters())[name].detach().double(), 1 / math.sqrt(D), name)
