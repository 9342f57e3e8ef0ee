"""Every norm scheme against an independent float64 reference of its equation (docs/schemes.md).

The reference below never calls a scheme's ``prepare``/``update``: it re-derives each scheme's loop
from the spec, reads the norm weights out of the trunk and passes them explicitly to
:func:`tests.models.reference.norm`. The sublayers F are the trunk's own attention / MLP modules,
called directly. All norm weights and scheme parameters are randomized first, so a scheme that
merely matches at init (scales 1, shifts 0, W = 0) does not pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor, nn

from models import Trunk, TrunkConfig
from models.norms import POINTWISE, Derf
from models.schemes import SCHEMES, NormScheme, get_scheme
from tests.models import reference as ref
from tests.models.reference_mhc import ref_mhc_any

D, L, HEADS, HIDDEN = 16, 3, 2, 24
BATCH, TOKENS = 2, 5
ALL_SCHEMES = list(NormScheme)
NORM_LAYERS = ["layernorm", "rmsnorm", "dyt", "derf"]


def build(scheme: str, norm_layer: str = "layernorm", conditioned: bool = False, **overrides) -> Trunk:
    """A tiny float64 trunk with every norm / scheme / adaLN parameter randomized."""
    cfg = TrunkConfig(
        dim=D,
        depth=overrides.pop("depth", L),
        num_heads=HEADS,
        mlp_hidden=HIDDEN,
        norm_scheme=scheme,
        norm_layer=norm_layer,
        norm_eps=1e-5,
        **overrides,
    )
    trunk = Trunk(cfg, conditioned=conditioned).double().eval()
    randomize(trunk)
    return trunk


@torch.no_grad()
def randomize(module: nn.Module) -> None:
    """Non-trivial values for everything the scheme equations touch."""
    for m in module.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm, *POINTWISE)) and m.weight is not None:
            m.weight.copy_(1 + 0.3 * torch.randn_like(m.weight))
            if getattr(m, "bias", None) is not None:
                m.bias.copy_(0.3 * torch.randn_like(m.bias))
        if isinstance(m, POINTWISE):  # every DyT / Derf its own alpha, affine or not (adaLN's ones learn it too)
            m.alpha.copy_(0.3 + 0.6 * torch.rand_like(m.alpha))
        if isinstance(m, Derf):  # and every Derf its own shift s
            m.shift.copy_(0.4 * torch.randn_like(m.shift))
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("w_read", "w_depth", "w_write"):  # Hyper-Connections' W_m, W_r, W_b
            p.copy_(0.3 * torch.randn_like(p))
        elif leaf in ("s_a", "s_b"):
            p.copy_(0.2 + 0.5 * torch.rand_like(p))
        elif leaf == "gain":  # siamese_hybrid's g
            p.copy_(1 + 0.3 * torch.randn_like(p))
        elif leaf in ("query", "hc_base"):  # AttnRes' pseudo-queries w_l (0 at init); paper mHC's b_pre/post/res
            p.copy_(0.5 * torch.randn_like(p))
        elif leaf == "hc_scale":  # its a_pre, a_post, a_res
            p.copy_(0.2 + 0.5 * torch.rand_like(p))
        elif ".adaLN." in name:
            p.copy_(0.3 * torch.randn_like(p))


#################################################################################
#                 The reference: the equations of every scheme                  #
#################################################################################


class Ref:
    """Shared pieces of every scheme's reference loop.

    ``own(norm, x)``: a scheme's own branch-input norm; non-affine in conditioned mode.
    ``added(x, norm)``: where a scheme has no branch-input norm: identity, or a non-affine norm when conditioned
    (``norm``, the module that holds it, is needed only for DyT's alpha).
    ``F(b, kind, inp)``: the sublayer, wrapped by adaLN-Zero's modulate and gate when conditioned.
    """

    def __init__(self, trunk: Trunk, cond: Tensor | None) -> None:
        self.trunk, self.cfg = trunk, trunk.cfg
        self.mods: list[tuple[Tensor, ...]] | None = None
        if cond is not None:
            self.mods = []
            for blk in trunk.blocks:
                lin = blk.adaLN.net[1]
                m = ref.linear(ref.silu(cond), lin.weight, lin.bias)[:, None, :]  # (B, 1, 6D)
                # DiT order: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
                self.mods.append(tuple(m[..., i * D : (i + 1) * D] for i in range(6)))

    def N(self, module: nn.Module, x: Tensor) -> Tensor:
        """An affine norm with ``module``'s weight (and bias; DyT: and alpha)."""
        assert module.weight is not None, f"expected an affine norm, got {module}"
        bias, alpha = getattr(module, "bias", None), self.alpha(module)
        return ref.norm(x, self.cfg.norm_layer, self.cfg.norm_eps, module.weight, bias, alpha, self.shift(module))

    def alpha(self, module: nn.Module | None) -> Tensor | None:
        if self.cfg.norm_layer not in ("dyt", "derf"):
            return None
        assert module is not None, "a DyT / Derf reference needs the module holding alpha"
        return module.alpha

    def shift(self, module: nn.Module | None) -> Tensor | None:
        if self.cfg.norm_layer != "derf":
            return None
        assert module is not None, "a Derf reference needs the module holding s"
        return module.shift

    def plain(self, x: Tensor, module: nn.Module | None = None) -> Tensor:
        assert module is None or module.weight is None, f"expected a non-affine norm, got {module}"
        kind, eps = self.cfg.norm_layer, self.cfg.norm_eps
        return ref.norm(x, kind, eps, alpha=self.alpha(module), shift=self.shift(module))

    def own(self, module: nn.Module, x: Tensor) -> Tensor:
        return self.plain(x, module) if self.mods else self.N(module, x)

    def added(self, x: Tensor, module: nn.Module | None = None) -> Tensor:
        return self.plain(x, module) if self.mods else x

    def F(self, b: int, kind: str, inp: Tensor) -> Tensor:
        blk = self.trunk.blocks[b]
        if self.mods:
            shift, scale, gate = self.mods[b][:3] if kind == "attn" else self.mods[b][3:]
            inp = ref.modulate(inp, shift, scale)
        out = blk.attn(inp) if kind == "attn" else blk.mlp(inp)
        return gate * out if self.mods else out

    def sites(self) -> Iterator[tuple[int, int, str, nn.Module]]:
        """(block b, sublayer s, kind, the scheme site holding its norms) in order."""
        for b, blk in enumerate(self.trunk.blocks):
            yield b, 2 * b, "attn", blk.attn_res
            yield b, 2 * b + 1, "mlp", blk.mlp_res


def pre_step(r: Ref, b: int, kind: str, site: nn.Module, x: Tensor) -> Tensor:
    return x + r.F(b, kind, r.own(site.norm, x))  # x = x + F(N(x))


def post_step(r: Ref, b: int, kind: str, site: nn.Module, x: Tensor) -> Tensor:
    return r.N(site.norm, x + r.F(b, kind, r.added(x, site.cond_norm)))  # x = N(x + F(x))


def ref_pre(r: Ref, h: Tensor) -> Tensor:
    x = h
    for b, _, kind, site in r.sites():
        x = pre_step(r, b, kind, site, x)
    return r.own(r.trunk.readout.norm_f, x)  # N_f(x)


def ref_post(r: Ref, h: Tensor) -> Tensor:
    x = h
    for b, _, kind, site in r.sites():
        x = post_step(r, b, kind, site, x)
    return r.added(x, r.trunk.readout.norm_f)  # x


def ref_peri(r: Ref, h: Tensor) -> Tensor:
    x = h
    for b, _, kind, site in r.sites():
        x = x + r.N(site.norm_out, r.F(b, kind, r.own(site.norm_in, x)))  # x = x + N_out(F(N_in(x)))
    return r.own(r.trunk.readout.norm_f, x)


def ref_deepnorm(r: Ref, h: Tensor) -> Tensor:
    alpha = (2 * r.cfg.depth) ** 0.25
    x = h
    for b, _, kind, site in r.sites():
        x = r.N(site.norm, alpha * x + r.F(b, kind, r.added(x, site.cond_norm)))  # x = N(alpha x + F(x))
    return r.added(x, r.trunk.readout.norm_f)


def ref_mixln(r: Ref, h: Tensor) -> Tensor:
    n_post = math.floor(r.cfg.mix_ratio * r.cfg.depth)
    x = h
    for b, _, kind, site in r.sites():
        step = post_step if b < n_post else pre_step
        x = step(r, b, kind, site.inner, x)
    return r.own(r.trunk.readout.norm_f, x)


def ref_hybrid(r: Ref, h: Tensor) -> Tensor:
    x = h
    for b, _, kind, site in r.sites():
        c = math.sqrt(2 * (b + 1)) if r.cfg.hybrid_depth_scaling else 1.0
        if kind == "attn":
            x = x + r.F(b, kind, r.added(x, site.cond_norm)) / c  # x = x + Attn(x) / c, QKV-norm inside Attn
        else:
            u = r.N(site.norm, x)  # u = N(x); x = u + F(u) / c
            x = u + r.F(b, kind, r.added(u, site.cond_norm)) / c
    return r.own(r.trunk.readout.norm_f, x)


def ref_resi_dual(r: Ref, h: Tensor) -> Tensor:
    x = d = h  # both streams from the embedding
    for b, _, kind, site in r.sites():
        o = r.F(b, kind, r.added(x, site.cond_norm))
        x = r.N(site.norm, x + o)
        d = d + o
    ro = r.trunk.readout
    return r.added(x + r.N(ro.norm_d, d), ro.norm_f)  # x + N_d(d)


def ref_resi_dual_hybrid(r: Ref, h: Tensor) -> Tensor:
    x = d = h  # both streams from the embedding
    for b, _, kind, site in r.sites():
        if kind == "attn":
            o = r.F(b, kind, r.added(x, site.cond_norm))  # o = Attn(x), QKV-norm inside; x = x + o
            x = x + o
        else:
            u = r.N(site.norm, x)  # u = N(x); o = F(u); x = u + o
            o = r.F(b, kind, r.added(u, site.cond_norm))
            x = u + o
        d = d + o
    ro = r.trunk.readout
    return r.added(r.N(ro.norm_x, x) + r.N(ro.norm_d, d), ro.norm_f)  # N_x(x) + N_d(d)


def ref_hyper(r: Ref, h: Tensor) -> Tensor:
    n = 2
    H = [h] * n  # n copies of the embedding
    for b, k, kind, site in r.sites():
        Hn = [r.N(site.norm_h, Hi) for Hi in H]
        s_a, s_b = site.s_a, site.s_b
        A_m = [float(i == k % n) + s_a * torch.tanh(Hn[i] @ site.w_read) for i in range(n)]  # e_(k mod n) + ...
        A_r = [[float(i == j) + s_a * torch.tanh(Hn[i] @ site.w_depth[:, j]) for j in range(n)] for i in range(n)]
        B = [1.0 + s_b * torch.tanh(Hn[i] @ site.w_write) for i in range(n)]
        h_in = sum(A_m[i][..., None] * H[i] for i in range(n))  # A_m^T H
        o = r.F(b, kind, r.own(site.norm_in, h_in))  # o = F(N(h_in))
        H = [B[j][..., None] * o + sum(A_r[i][j][..., None] * H[i] for i in range(n)) for j in range(n)]
    return r.own(r.trunk.readout.norm_f, sum(H))  # N_f(sum of streams)


def _siamese(r: Ref, h: Tensor, hybrid: bool) -> Tensor:
    opts = r.cfg
    x = y = h
    for b, _, kind, site in r.sites():
        c = math.sqrt(2 * (b + 1)) if opts.siamese_depth_scaling else 1.0
        if hybrid and kind == "attn":
            o = r.F(b, kind, r.added(site.gain * x + r.N(site.norm_y, y), site.cond_norm))  # h = g x + N_Y(y)
        else:
            x = r.N(site.norm_x, x)  # X post-norm at sublayer start
            z = x + r.N(site.norm_y, y)
            o = r.F(b, kind, r.own(site.norm_in, z) if opts.siamese_input_norm else r.added(z, site.norm_in))
        x = x + o / c
        y = y + o
    ro = r.trunk.readout
    return r.own(ro.norm_o, r.N(ro.norm_a, x) + r.N(ro.norm_b, y))  # N_o(N_a(x) + N_b(y))


def ref_siamese(r: Ref, h: Tensor) -> Tensor:
    return _siamese(r, h, hybrid=False)


def ref_siamese_hybrid(r: Ref, h: Tensor) -> Tensor:
    return _siamese(r, h, hybrid=True)


def ref_lns(r: Ref, h: Tensor) -> Tensor:
    x = h
    for b, _, kind, site in r.sites():
        x = x + r.F(b, kind, r.own(site.norm, x) / math.sqrt(b + 1))  # x = x + F(N(x) / sqrt(l)), l = b + 1
    return r.own(r.trunk.readout.norm_f, x)  # N_f(x), unscaled


def ref_keel(r: Ref, h: Tensor) -> Tensor:
    alpha = 2 * r.cfg.depth  # L, the number of sublayers
    x = h
    for b, _, kind, site in r.sites():
        x = r.N(site.norm, alpha * x + r.F(b, kind, r.own(site.norm_in, x)))  # x = N_1(alpha x + F(N_2(x)))
    return r.added(x, r.trunk.readout.norm_f)  # x


def ref_reordered(r: Ref, h: Tensor) -> Tensor:
    x = h
    for b, _, kind, site in r.sites():
        x = x + r.N(site.norm, r.F(b, kind, r.added(x, site.cond_norm)))  # x = x + N(F(x))
    return r.own(r.trunk.readout.norm_f, x)  # N_f(x)


def _depth_attention(r: Ref, sources: list[Tensor], query: Tensor, key_norm: nn.Module) -> Tensor:
    """``sum_i softmax_i(w . N_k(v_i)) v_i``, the softmax written out over the list of sources (one source: itself)."""
    if len(sources) == 1:
        return sources[0]
    scores = [torch.exp(r.N(key_norm, v) @ query) for v in sources]
    total = sum(scores)
    return sum((sc / total)[..., None] * v for sc, v in zip(scores, sources, strict=True))


def _attn_res(r: Ref, h: Tensor, block_size: int) -> Tensor:
    blocks, partial = [h], None  # b_0 = the embedding; the open block's partial sum of outputs
    for b, s, kind, site in r.sites():
        sources = blocks + ([] if partial is None else [partial])
        o = r.F(b, kind, r.own(site.norm, _depth_attention(r, sources, site.query, site.key_norm)))
        partial = o if partial is None else partial + o
        if (s + 1) % block_size == 0 or s == 2 * r.cfg.depth - 1:  # the block is complete: a source of its own
            blocks, partial = blocks + [partial], None
    ro = r.trunk.readout
    return r.own(ro.norm_f, _depth_attention(r, blocks, ro.query, ro.key_norm))


def ref_attn_res(r: Ref, h: Tensor) -> Tensor:
    return _attn_res(r, h, 1)  # Full AttnRes: every sublayer's output its own source


def ref_block_attn_res(r: Ref, h: Tensor) -> Tensor:
    return _attn_res(r, h, r.cfg.attn_res_block_size)


REFERENCES: dict[NormScheme, Callable[[Ref, Tensor], Tensor]] = {
    NormScheme.PRE: ref_pre,
    NormScheme.POST: ref_post,
    NormScheme.PERI: ref_peri,
    NormScheme.DEEPNORM: ref_deepnorm,
    NormScheme.MIXLN: ref_mixln,
    NormScheme.HYBRID: ref_hybrid,
    NormScheme.RESI_DUAL: ref_resi_dual,
    NormScheme.RESI_DUAL_HYBRID: ref_resi_dual_hybrid,
    NormScheme.HYPER: ref_hyper,
    NormScheme.SIAMESE: ref_siamese,
    NormScheme.SIAMESE_HYBRID: ref_siamese_hybrid,
    NormScheme.MHC: ref_mhc_any,
    NormScheme.LNS: ref_lns,
    NormScheme.REORDERED: ref_reordered,
    NormScheme.KEEL: ref_keel,
    NormScheme.ATTN_RES: ref_attn_res,
    NormScheme.BLOCK_ATTN_RES: ref_block_attn_res,
}


@torch.no_grad()
def check_against_reference(trunk: Trunk, conditioned: bool) -> None:
    h = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    cond = torch.randn(BATCH, D, dtype=torch.float64) if conditioned else None
    out = trunk(h, cond=cond)
    expected = REFERENCES[NormScheme(trunk.cfg.norm_scheme)](Ref(trunk, cond), h)
    assert out.shape == (BATCH, TOKENS, D)
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


#################################################################################
#                                     Tests                                     #
#################################################################################


def test_every_scheme_is_registered_and_has_a_reference():
    assert set(SCHEMES) == set(NormScheme)
    assert set(REFERENCES) == set(NormScheme)
    for name in NormScheme:
        assert get_scheme(name.value).name is name


@pytest.mark.parametrize("norm_layer", NORM_LAYERS)
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_trunk_matches_reference(scheme, norm_layer):
    check_against_reference(build(scheme, norm_layer), conditioned=False)


@pytest.mark.parametrize("norm_layer", NORM_LAYERS)
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_conditioned_trunk_matches_reference(scheme, norm_layer):
    """adaLN-Zero: branch input -> non-affine norm -> modulate; gate * F before the update; the
    readout's outermost norm non-affine (added where the readout had none)."""
    check_against_reference(build(scheme, norm_layer, conditioned=True), conditioned=True)


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("depth_scaling", [True, False], ids=["c", "no_c"])
@pytest.mark.parametrize("input_norm", [True, False], ids=["n_in", "no_n_in"])
@pytest.mark.parametrize("scheme", [NormScheme.SIAMESE, NormScheme.SIAMESE_HYBRID])
def test_siamese_ablations_match_reference(scheme, input_norm, depth_scaling, conditioned):
    trunk = build(scheme, conditioned=conditioned, siamese_input_norm=input_norm, siamese_depth_scaling=depth_scaling)
    check_against_reference(trunk, conditioned)


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("norm_layer", NORM_LAYERS)
def test_hybrid_depth_scaling_matches_reference(norm_layer, conditioned):
    """HybridNorm with SiameseNorm's depth scaling on its single stream (paper Table 3), both sublayers."""
    check_against_reference(build(NormScheme.HYBRID, norm_layer, conditioned, hybrid_depth_scaling=True), conditioned)


def test_hybrid_depth_scaling_divides_each_update_by_c():
    """Same weights: with every branch output zeroed but one, the switch divides that update by c."""
    base, scaled = build(NormScheme.HYBRID, depth=2), build(NormScheme.HYBRID, depth=2, hybrid_depth_scaling=True)
    scaled.load_state_dict(base.state_dict())
    h = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    site = base.blocks[1].attn_res, scaled.blocks[1].attn_res
    out = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    assert site[0].c == 1.0 and site[1].c == pytest.approx(2.0)  # c = sqrt(2 (b + 1)) for block 1
    torch.testing.assert_close(site[1].update(h, out), h + out / 2.0)


@pytest.mark.parametrize("scheme", [NormScheme.SIAMESE, NormScheme.SIAMESE_HYBRID])
def test_siamese_ablation_switches_change_the_output(scheme):
    """The switches are live: each one alone changes the trunk output (same weights)."""
    h = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    torch.manual_seed(3)
    base = build(scheme)
    outs = {}
    variants = {"base": {}, "no_n_in": {"siamese_input_norm": False}, "no_c": {"siamese_depth_scaling": False}}
    for key, kw in variants.items():
        trunk = build(scheme, **kw)
        trunk.load_state_dict(base.state_dict(), strict=key != "no_n_in")
        with torch.no_grad():
            outs[key] = trunk(h)
    assert not torch.allclose(outs["base"], outs["no_n_in"])
    assert not torch.allclose(outs["base"], outs["no_c"])


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 6])
def test_block_attn_res_block_sizes_match_reference(block_size, conditioned):
    """L = 3 (6 sublayers): blocks of 1 (Full), of 2 (a transformer block), of 3 and 4 (blocks that cut a
    transformer block; 4: the last block incomplete, closed by the last sublayer) and 6 (one block)."""
    trunk = build(NormScheme.BLOCK_ATTN_RES, conditioned=conditioned, attn_res_block_size=block_size)
    check_against_reference(trunk, conditioned)


@torch.no_grad()
def test_attn_res_at_init_reads_the_mean_of_its_sources():
    """Zero pseudo-queries: sublayer 0 reads the embedding, sublayer 1 the mean of the embedding and o_0."""
    trunk = Trunk(TrunkConfig(dim=D, depth=2, num_heads=HEADS, norm_scheme="attn_res", norm_layer="rmsnorm")).double()
    h, o = torch.randn(BATCH, TOKENS, D, dtype=torch.float64), torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    s0, s1 = trunk.blocks[0].attn_res, trunk.blocks[0].mlp_res
    inp, state = s0.prepare(s0.init_state(h))
    torch.testing.assert_close(inp, ref.norm(h, "rmsnorm", 1e-6, s0.norm.weight))
    state = s0.update(state, o)
    assert len(state.blocks) == 2 and state.blocks[1] is o  # Full: o_0 is a source of its own, stored as is
    inp, _ = s1.prepare(state)
    torch.testing.assert_close(inp, ref.norm((h + o) / 2, "rmsnorm", 1e-6, s1.norm.weight))


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
@pytest.mark.parametrize("mix_ratio", [0.0, 0.25, 0.5, 0.74, 1.0])
def test_mixln_ratio_matches_reference(mix_ratio, conditioned):
    """L = 4: floor(mix_ratio * L) = 0, 1, 2, 2 (floor, not round), 4 Post-Norm blocks."""
    trunk = build(NormScheme.MIXLN, conditioned=conditioned, depth=4, mix_ratio=mix_ratio)
    check_against_reference(trunk, conditioned)


def test_mixln_default_ratio_is_a_quarter():
    assert TrunkConfig().mix_ratio == 0.25


@pytest.mark.parametrize("ffn", ["gelu", "swiglu", "moe"])
def test_deepnorm_init_scales_value_out_and_mlp_by_beta(ffn):
    """beta = (8L)^(-1/4) on the value third of qkv, the attention out-proj and the MLP weights,
    relative to a `pre` trunk built from the same seed (same RNG order, so a plain ratio)."""
    depth = 5
    kw = dict(dim=D, depth=depth, num_heads=HEADS, mlp_hidden=HIDDEN, mlp="swiglu" if ffn != "gelu" else "gelu")
    if ffn == "moe":
        kw.update(moe_experts=4, moe_top_k=2)
    torch.manual_seed(11)
    pre = Trunk(TrunkConfig(norm_scheme="pre", **kw))
    torch.manual_seed(11)
    deep = Trunk(TrunkConfig(norm_scheme="deepnorm", **kw))
    beta = (8 * depth) ** -0.25

    def ratio(a: Tensor, b: Tensor, expected: float) -> None:
        torch.testing.assert_close(b, a * expected, rtol=1e-6, atol=0)

    for bp, bd in zip(pre.blocks, deep.blocks, strict=True):
        ratio(bp.attn.qkv.weight[: 2 * D], bd.attn.qkv.weight[: 2 * D], 1.0)  # Q and K untouched
        ratio(bp.attn.qkv.weight[2 * D :], bd.attn.qkv.weight[2 * D :], beta)  # V
        ratio(bp.attn.proj.weight, bd.attn.proj.weight, beta)
        if ffn == "moe":
            ratio(bp.mlp.w_in, bd.mlp.w_in, beta)
            ratio(bp.mlp.w_out, bd.mlp.w_out, beta)
            ratio(bp.mlp.router.weight, bd.mlp.router.weight, 1.0)
        else:
            ratio(bp.mlp.fc1.weight, bd.mlp.fc1.weight, beta)
            ratio(bp.mlp.fc2.weight, bd.mlp.fc2.weight, beta)
    assert get_scheme("deepnorm").branch_init_gain(depth) == pytest.approx(beta)
    for name in NormScheme:
        if name is not NormScheme.DEEPNORM:
            assert get_scheme(name).branch_init_gain(depth) == 1.0


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_init_values(scheme):
    """All norm scales start at 1 (shifts 0); Hyper-Connections: W_* = 0, s_a = s_b = 0.01;
    siamese_hybrid's g = 1; adaLN-Zero weights 0."""
    trunk = Trunk(TrunkConfig(dim=D, depth=L, num_heads=HEADS, norm_scheme=scheme), conditioned=True)
    for m in trunk.modules():
        if isinstance(m, (nn.LayerNorm, nn.RMSNorm)) and m.weight is not None:
            assert torch.equal(m.weight, torch.ones_like(m.weight))
            if getattr(m, "bias", None) is not None:
                assert torch.equal(m.bias, torch.zeros_like(m.bias))
    for name, p in trunk.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("w_read", "w_depth", "w_write") or ".adaLN." in name:
            assert torch.count_nonzero(p) == 0, name
        elif leaf in ("s_a", "s_b"):
            assert p.item() == pytest.approx(0.01), name
        elif leaf == "gain":
            assert torch.equal(p, torch.ones_like(p)), name


QKV_NORM_SCHEMES = [NormScheme.HYBRID, NormScheme.RESI_DUAL_HYBRID, NormScheme.SIAMESE_HYBRID]


@pytest.mark.parametrize("scheme", QKV_NORM_SCHEMES)
def test_hybrid_attention_normalizes_q_k_v_per_head(scheme):
    trunk = build(scheme, bias=True)
    attn = trunk.blocks[1].attn
    randomize(attn)
    with torch.no_grad():
        attn.qkv.bias.normal_()
    x = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    kind, eps = trunk.cfg.norm_layer, trunk.cfg.norm_eps

    def per_head(m: nn.Module):
        return lambda t: ref.norm(t, kind, eps, m.weight, m.bias)

    expected = ref.attention(
        x,
        HEADS,
        attn.qkv.weight,
        attn.qkv.bias,
        attn.proj.weight,
        attn.proj.bias,
        q_norm=per_head(attn.q_norm),
        k_norm=per_head(attn.k_norm),
        v_norm=per_head(attn.v_norm),
    )
    with torch.no_grad():
        torch.testing.assert_close(attn(x), expected, atol=1e-10, rtol=1e-10)
    assert attn.v_norm.weight.shape == (D // HEADS,)  # per head, not over D


@pytest.mark.parametrize("scheme", sorted(set(NormScheme) - set(QKV_NORM_SCHEMES)))
def test_other_schemes_do_not_normalize_v(scheme):
    trunk = Trunk(TrunkConfig(dim=D, depth=L, num_heads=HEADS, norm_scheme=scheme))
    assert not get_scheme(scheme).qkv_norm
    assert all(isinstance(b.attn.v_norm, nn.Identity) for b in trunk.blocks)


def test_unknown_scheme_raises_listing_valid_ones():
    with pytest.raises(ValueError) as err:
        get_scheme("layerscale")
    msg = str(err.value)
    assert "layerscale" in msg
    for name in NormScheme:
        assert name.value in msg


@pytest.mark.parametrize("conditioned", [False, True])
def test_cond_must_match_the_mode(conditioned):
    trunk = Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS), conditioned=conditioned)
    h = torch.randn(BATCH, TOKENS, D)
    wrong = None if conditioned else torch.randn(BATCH, D)
    with pytest.raises(ValueError, match="cond"):
        trunk(h, cond=wrong)


#################################################################################
#            LayerNorm Scaling and OLMo 2's reordered norm: their facts         #
#################################################################################


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "adaln"])
def test_lns_scales_both_sublayers_of_block_b_by_one_over_sqrt_b_plus_1(conditioned):
    """The authors' code and OLMo-core: per block, 1-based (block 0 unscaled), both sublayers alike, the readout
    unscaled. L = 4: 1, 1/sqrt(2), 1/sqrt(3), 1/2."""
    trunk = build(NormScheme.LNS, "rmsnorm", conditioned, depth=4)
    factors = [1.0, 0.7071067811865476, 0.5773502691896258, 0.5]
    x = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    for blk, factor in zip(trunk.blocks, factors, strict=True):
        for site in (blk.attn_res, blk.mlp_res):
            assert site.scale == pytest.approx(factor, rel=1e-15)
            inp, state = site.prepare(x)
            assert state is x
            w = None if conditioned else site.norm.weight
            torch.testing.assert_close(inp, factor * ref.norm(x, "rmsnorm", 1e-5, w), atol=1e-12, rtol=1e-12)
    assert not hasattr(trunk.readout, "scale")


def test_reordered_has_no_branch_input_norm_and_pre_norms_parameter_count():
    """F reads the residual itself (no N before it); one N per sublayer (after F) and N_f: Pre-Norm's count."""
    trunk, pre = build(NormScheme.REORDERED), build(NormScheme.PRE)
    x = torch.randn(BATCH, TOKENS, D, dtype=torch.float64)
    inp, state = trunk.blocks[0].attn_res.prepare(x)
    assert inp is x and state is x
    assert sum(p.numel() for p in trunk.parameters()) == sum(p.numel() for p in pre.parameters())
