"""Grouped-query attention (``TrunkConfig.num_kv_heads``): the attention against a float64 reference written from
the equations, every scheme with it, and transformers' Llama (``num_key_value_heads``), Qwen3 (per-head QK-norm)
and OLMo 2 (QK-norm over the whole q and k, k of width ``num_kv_heads * head_dim``) attention at the same weights.

The reference maps query head h to key/value head ``h // (H / H_kv)`` (transformers' ``repeat_kv``, a
``repeat_interleave``); a module that read ``h % H_kv`` instead would differ from it, which
``test_the_comparison_tells_the_grouping_apart`` shows on the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn

from models import LanguageModel, TrunkConfig
from models.layers import Attention
from models.schemes import NormScheme
from models.trunk import Trunk

D, HEADS, B, N = 32, 4, 2, 7
DH = D // HEADS
EPS = 1e-5


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * w`` over the last axis."""
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * w + b`` over the last axis (biased variance)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def norm_of(module: nn.Module, kind: str):
    """The module's affine parameters in the written-out equation (None for an Identity)."""
    if isinstance(module, nn.Identity):
        return None
    if kind == "rmsnorm":
        return lambda t: rms_norm(t, module.weight, EPS)
    return lambda t: layer_norm(t, module.weight, module.bias, EPS)


def rotate(x: Tensor, base: float = 10000.0) -> Tensor:
    """RoPE, rotate-half layout, in float64: channel pair (i, i + Dh/2) of position p turned by
    ``p * base^(-2i/Dh)``. ``x``: ``(..., N, Dh)``."""
    n, dh = x.shape[-2], x.shape[-1]
    i = torch.arange(dh // 2, dtype=torch.float64)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * base ** (-2 * i / dh)  # (N, Dh/2)
    a, b = x[..., : dh // 2], x[..., dh // 2 :]
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)


def gqa_reference(
    x: Tensor,
    heads: int,
    kv_heads: int,
    w_qkv: Tensor,
    b_qkv: Tensor | None,
    w_out: Tensor,
    b_out: Tensor | None,
    per_head: tuple | None = None,
    full: tuple | None = None,
    v_norm=None,
    causal: bool = True,
    rope: bool = True,
    kv_of=lambda h, group: h // group,
) -> Tensor:
    """Grouped-query attention written out, one query head at a time.

    ``w_qkv`` holds ``W_q`` (``H Dh`` rows), ``W_k``, ``W_v`` (``H_kv Dh`` rows each), head 0's rows first;
    ``per_head = (q_norm, k_norm)`` act on each head's ``Dh`` channels, ``full = (q_norm, k_norm)`` on all of q
    (width ``H Dh``) and all of k (width ``H_kv Dh``) before the head split (OLMo 2); then RoPE on q and k, the
    causal ``softmax(q k^T / sqrt(Dh)) v`` and the output projection. ``kv_of(h, group)``: the key/value head of
    query head h.
    """
    n, dh = x.shape[1], x.shape[2] // heads
    group = heads // kv_heads
    qkv = x @ w_qkv.T + (0 if b_qkv is None else b_qkv)
    q_all = qkv[..., : heads * dh]
    k_all = qkv[..., heads * dh : (heads + kv_heads) * dh]
    v_all = qkv[..., (heads + kv_heads) * dh :]
    assert v_all.shape[-1] == kv_heads * dh
    if full is not None:
        q_all, k_all = full[0](q_all), full[1](k_all)
    outs = []
    for h in range(heads):
        j = kv_of(h, group)
        q = q_all[..., h * dh : (h + 1) * dh]
        k = k_all[..., j * dh : (j + 1) * dh]
        v = v_all[..., j * dh : (j + 1) * dh]
        if per_head is not None:
            q, k = per_head[0](q), per_head[1](k)
        if v_norm is not None:
            v = v_norm(v)
        if rope:
            q, k = rotate(q), rotate(k)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # (B, N, N)
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        outs.append(weights / weights.sum(-1, keepdim=True) @ v)
    return torch.cat(outs, dim=-1) @ w_out.T + (0 if b_out is None else b_out)


def rope64(n: int, dh: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """The module's rotary tables computed in float64 (``rope_tables`` builds them in float32)."""
    inv = 1.0 / base ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def randomized(attn: Attention, seed: int = 0) -> Attention:
    """Every weight, bias and norm parameter drawn at random (norm scales away from 1), in float64."""
    gen = torch.Generator().manual_seed(seed)
    attn = attn.double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            scale = 0.3 if "norm" in name else 1 / math.sqrt(D)
            p.copy_((1.0 if "norm" in name and name.endswith("weight") else 0.0) + scale * torch.randn(
                p.shape, generator=gen, dtype=torch.float64))  # fmt: skip
    return attn


MODES = {  # name -> (Attention keyword arguments, norm layer)
    "plain": (dict(), "rmsnorm"),
    "per_head-rms": (dict(qk_norm=True), "rmsnorm"),
    "per_head-ln": (dict(qk_norm=True), "layernorm"),
    "full-rms": (dict(qk_norm=True, qk_norm_scope="full"), "rmsnorm"),
    "full-ln": (dict(qk_norm=True, qk_norm_scope="full"), "layernorm"),
    "qkv_norm-ln": (dict(qkv_norm=True), "layernorm"),  # HybridNorm's per-head q, k and v norms
}


def build(mode: str, kv_heads: int, bias: bool = True) -> Attention:
    kwargs, layer = MODES[mode]
    attn = Attention(D, HEADS, bias=bias, norm_layer=layer, norm_eps=EPS, num_kv_heads=kv_heads, **kwargs)
    return randomized(attn).eval()


def expected(attn: Attention, mode: str, kv_heads: int, x: Tensor, causal=True, rope=True, **kw) -> Tensor:
    layer = MODES[mode][1]
    q_norm, k_norm, v_norm = (norm_of(m, layer) for m in (attn.q_norm, attn.k_norm, attn.v_norm))
    scoped = None if q_norm is None else (q_norm, k_norm)
    full = mode.startswith("full")
    w = (attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias)
    return gqa_reference(x, HEADS, kv_heads, *w, per_head=None if full else scoped, full=scoped if full else None,
                         v_norm=v_norm, causal=causal, rope=rope, **kw)  # fmt: skip


def inputs(seed: int = 1) -> Tensor:
    """Asymmetric: every token, channel and sample differs (no head sees what another does)."""
    return torch.randn(B, N, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("mode", list(MODES))
def test_gqa_attention_equals_the_float64_reference(mode: str, kv_heads: int):
    attn = build(mode, kv_heads)
    kv_dim = kv_heads * DH
    assert attn.qkv.weight.shape == (D + 2 * kv_dim, D)
    if mode.startswith("full"):  # OLMo 2: q over all heads (D), k over all key heads (H_kv Dh)
        assert attn.q_norm.weight.shape == (D,) and attn.k_norm.weight.shape == (kv_dim,)
    elif mode != "plain":
        assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (DH,)
    x = inputs()
    with torch.no_grad():
        out = attn(x, rope=rope64(N, DH), is_causal=True)
    want = expected(attn, mode, kv_heads, x)
    assert (out - want).abs().max() < 1e-12, float((out - want).abs().max())


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_attention_without_mask_or_rope_equals_the_reference(kv_heads: int):
    """The ViT's and the DiT's attention: bidirectional, no RoPE."""
    attn = build("per_head-ln", kv_heads)
    x = inputs(2)
    with torch.no_grad():
        out = attn(x)
    assert (out - expected(attn, "per_head-ln", kv_heads, x, causal=False, rope=False)).abs().max() < 1e-12


def test_the_comparison_tells_the_grouping_apart():
    """Query head h reads key/value head h // 2 of 2: the reference with h % 2 (0, 1, 0, 1 instead of 0, 0, 1, 1)
    is far from the module, so a module grouping that way would fail the comparison above."""
    attn = build("per_head-rms", 2)
    x = inputs()
    with torch.no_grad():
        out = attn(x, rope=rope64(N, DH), is_causal=True)
    wrong = expected(attn, "per_head-rms", 2, x, kv_of=lambda h, group: h % 2)
    assert (out - wrong).abs().max() > 1e-2


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_enable_gqa_equals_repeating_keys_and_values(kv_heads: int):
    """SDPA's ``enable_gqa`` (what the module calls) against k and v repeated per query head, causal, on CPU."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, HEADS, N, DH, generator=gen)
    k, v = (torch.randn(B, kv_heads, N, DH, generator=gen) for _ in range(2))
    group = HEADS // kv_heads
    fast = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    slow = nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=True
    )
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-6)


def test_num_kv_heads_equal_to_num_heads_is_multi_head_attention():
    """Explicit ``num_kv_heads = num_heads`` and the default build the same parameters and forward."""
    torch.manual_seed(0)
    a = Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS, qk_norm=True))
    torch.manual_seed(0)
    b = Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS, qk_norm=True, num_kv_heads=HEADS))
    assert [(k, v.shape) for k, v in a.state_dict().items()] == [(k, v.shape) for k, v in b.state_dict().items()]
    assert a.blocks[0].attn.qkv.weight.shape == (3 * D, D)
    x = torch.randn(B, N, D)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("value", [3, 8])
def test_num_kv_heads_must_divide_num_heads(value: int):
    with pytest.raises(ValueError, match=rf"trunk num_kv_heads {value} does not divide num_heads 4; valid: one "
                                         r"of 1, 2, 4, or null \(= num_heads\)$"):  # fmt: skip
        TrunkConfig(dim=D, num_heads=4, num_kv_heads=value)


def test_the_value_rows_get_the_schemes_branch_gain():
    """DeepNorm's beta scales the value projection: the last ``H_kv Dh`` rows of the fused qkv, not 2 D on."""
    cfg = dict(dim=D, depth=2, num_heads=HEADS, num_kv_heads=1, init="normal", init_std=0.02)
    torch.manual_seed(0)
    pre = Trunk(TrunkConfig(**cfg, norm_scheme="post"))
    torch.manual_seed(0)
    deep = Trunk(TrunkConfig(**cfg, norm_scheme="deepnorm"))
    w_pre, w_deep = pre.blocks[0].attn.qkv.weight, deep.blocks[0].attn.qkv.weight
    gain = deep.scheme.branch_init_gain(2)
    assert gain != 1
    torch.testing.assert_close(w_deep[: D + DH], w_pre[: D + DH], rtol=0, atol=0)  # q and k untouched
    torch.testing.assert_close(w_deep[D + DH :], gain * w_pre[D + DH :])


@pytest.mark.parametrize("scheme", [s.value for s in NormScheme])
def test_every_scheme_trains_with_grouped_query_attention(scheme: str):
    """Forward and backward of a 2-block trunk with 2 key/value heads of 4 (QK-norm on), then a DiT-style
    conditioned one for the schemes' adaLN path: shapes, finite gradients, the k/v rows of qkv learn."""
    cfg = TrunkConfig(dim=D, depth=2, num_heads=HEADS, num_kv_heads=2, norm_scheme=scheme, qk_norm=True)
    torch.manual_seed(0)
    for conditioned in (False, True):  # conditioned: adaLN not zeroed, so the attention's gradients are not 0
        trunk = Trunk(replace(cfg, adaln_zero_init=not conditioned), conditioned=conditioned)
        x = torch.randn(B, N, D, requires_grad=True)
        out = trunk(x, cond=torch.randn(B, D) if conditioned else None, is_causal=not conditioned)
        assert out.shape == (B, N, D)
        out.square().mean().backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
        qkv = trunk.blocks[0].attn.qkv
        assert qkv.weight.shape == (D + 2 * 2 * DH, D)
        assert qkv.weight.grad[D:].abs().sum() > 0  # the k and v rows
        assert all(torch.isfinite(p.grad).all() for p in trunk.parameters() if p.grad is not None)


def test_language_model_with_gqa_has_fewer_parameters_by_the_kv_rows():
    base = dict(dim=D, depth=2, num_heads=HEADS, mlp="swiglu", mlp_hidden=48, bias=False)
    full, grouped = (LanguageModel(TrunkConfig(**base, num_kv_heads=kv), 61) for kv in (None, 1))
    saved = sum(p.numel() for p in full.parameters()) - sum(p.numel() for p in grouped.parameters())
    assert saved == 2 * 2 * (D - DH) * D  # 2 blocks x (k and v) x the missing rows


#################################################################################
#                  transformers' attention and Llama at the same weights          #
#################################################################################


def _hf_forward(attn_module, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    """transformers' attention layer, causal (no mask: SDPA's is_causal), on the rotary tables ``rope``."""
    cos, sin = rope
    return attn_module(x, position_embeddings=(cos[None], sin[None]), attention_mask=None)[0]


def _float64_rms(monkeypatch, module) -> None:
    """transformers' RMSNorms compute in float32 whatever the input; made dtype-preserving for a float64
    comparison (their equation otherwise unchanged: ``w * x / sqrt(mean(x^2) + eps)``)."""

    def forward(self, h: Tensor) -> Tensor:
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for name in dir(module):
        if name.endswith("RMSNorm"):
            monkeypatch.setattr(getattr(module, name), "forward", forward)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("family", ["llama", "qwen3", "olmo2"])
def test_gqa_attention_equals_transformers_attention(monkeypatch, family: str, kv_heads: int):
    """One attention layer at the same weights, float64, causal, RoPE: Llama (no QK-norm), Qwen3 (RMSNorm on each
    head's q and k: our ``per_head``) and OLMo 2 (RMSNorm over the whole q and the whole k, width
    ``num_key_value_heads * head_dim``: our ``full``)."""
    import importlib

    names = {"llama": "Llama", "qwen3": "Qwen3", "olmo2": "Olmo2"}
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    configs = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    _float64_rms(monkeypatch, modeling)
    config = getattr(configs, f"{names[family]}Config")(
        hidden_size=D, num_attention_heads=HEADS, num_key_value_heads=kv_heads, head_dim=DH, intermediate_size=16,
        num_hidden_layers=1, rms_norm_eps=EPS, attention_bias=False, max_position_embeddings=N, vocab_size=8,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    theirs = getattr(modeling, f"{names[family]}Attention")(config, layer_idx=0).double().eval()
    scope = {"llama": {}, "qwen3": dict(qk_norm=True), "olmo2": dict(qk_norm=True, qk_norm_scope="full")}[family]
    ours = Attention(D, HEADS, bias=False, norm_layer="rmsnorm", norm_eps=EPS, num_kv_heads=kv_heads, **scope)
    ours = randomized(ours).eval()
    qw, kw, vw = ours.qkv.weight.split([D, kv_heads * DH, kv_heads * DH])
    with torch.no_grad():
        for proj, w in (("q_proj", qw), ("k_proj", kw), ("v_proj", vw), ("o_proj", ours.proj.weight)):
            getattr(theirs, proj).weight.copy_(w)
        if scope:
            theirs.q_norm.weight.copy_(ours.q_norm.weight)
            theirs.k_norm.weight.copy_(ours.k_norm.weight)
    x, rope = inputs(), rope64(N, DH)  # one set of float64 rotary tables for both (RoPE: tests/models/test_layers)
    with torch.no_grad():
        want = _hf_forward(theirs, x, rope)
        got = ours(x, rope=rope, is_causal=True)
    diff = float((got - want).abs().max())
    print(f"\n{family} kv {kv_heads}: max |ours - transformers| = {diff:.1e}")
    assert diff < 1e-12


def test_a_gqa_suite_lm_converted_to_llama_gives_the_same_logits(monkeypatch):
    """Our LM with 2 key/value heads of 4 -> ``LlamaForCausalLM`` (``num_key_value_heads=2``), float64: the
    logits agree to rounding; and back again (``lm_from_llama`` reads num_key_value_heads into num_kv_heads)."""
    from transformers.models.llama import modeling_llama

    from models.loaders import llama_from_lm, lm_from_llama

    torch.manual_seed(0)
    cfg = TrunkConfig(dim=D, depth=2, num_heads=HEADS, num_kv_heads=2, mlp="swiglu", mlp_hidden=48,
                      norm_layer="rmsnorm", norm_eps=EPS, qk_norm=False, bias=False, init="normal")  # fmt: skip
    ours = LanguageModel(cfg, 61, max_seq_len=24, rope_base=500.0).double().eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    ids = torch.randint(0, 61, (3, 24), generator=torch.Generator().manual_seed(1))
    llama = llama_from_lm(ours)
    assert llama.config.num_key_value_heads == 2 < llama.config.num_attention_heads == HEADS
    assert llama.model.layers[0].self_attn.k_proj.weight.shape == (2 * DH, D)
    with torch.no_grad():
        mine = ours(ids)
        diff = float((mine - llama(input_ids=ids).logits).abs().max())
        _float64_rms(monkeypatch, modeling_llama)  # transformers' RMSNorm computes in float32
        exact = float((mine - llama(input_ids=ids).logits).abs().max())
    print(f"\nmax |logits ours - Llama(GQA)| = {diff:.1e} (its RMSNorm in float32), {exact:.1e} (in float64)")
    assert diff < 1e-6 and exact < 1e-12
    back = lm_from_llama(llama)  # float32, as lm_from_llama builds it
    assert back.cfg.num_kv_heads == 2 and back.cfg == TrunkConfig(**{**cfg.to_dict(), "init_std": 0.02})
    for key, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], value.float()), key


def test_timm_and_diffusers_loaders_refuse_a_gqa_network_in_one_named_line():
    """Their attention has a key/value head per query head: the refusal names num_kv_heads, not a shape diff."""
    from timm.models.vision_transformer import VisionTransformer

    from models import ViTClassifier
    from models.loaders import load_timm_vit

    timm_vit = VisionTransformer(img_size=8, patch_size=4, num_classes=3, embed_dim=D, depth=1, num_heads=HEADS)
    ours = ViTClassifier(TrunkConfig(dim=D, depth=1, num_heads=HEADS, num_kv_heads=2), 8, 4, 3, 3)
    with pytest.raises(ValueError, match="our num_kv_heads is 2 of 4 heads; the reference has one key/value head"):
        load_timm_vit(ours, timm_vit)
