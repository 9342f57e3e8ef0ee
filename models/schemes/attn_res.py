"""Attention Residuals (Kimi Team, Moonshot AI, arXiv 2603.15031): each sublayer's input is a softmax-weighted sum
over depth instead of the running residual sum.

Full AttnRes (``norm_scheme: attn_res``). The sources are the embedding ``v_0 = h`` and every earlier sublayer's
output ``v_i = F_i(...)``; sublayer l reads::

    h_l   = sum_{i < l} alpha_{i->l} v_i,     alpha_{.->l} = softmax_i( w_l . N_k(v_i) )
    o_l   = F_l(N(h_l))                        and o_l becomes the source v_l

``w_l`` (D) is a learned pseudo-query per sublayer, zero at init (so at init ``h_l`` is the plain mean of the
sources), ``N_k`` the key norm (the README's ``RMSNorm``; here the configured norm layer, affine), ``N`` the
sublayer's own input norm (the pre-norm of Attn / MLP).

Block AttnRes (``norm_scheme: block_attn_res``). The sublayers are cut into blocks of ``attn_res_block_size``
consecutive sublayers (default 2: one transformer block; the paper's ~8 blocks are ``2L / 8`` sublayers); a block's
source is the plain sum of its sublayers' outputs, and a sublayer reads the completed blocks (the embedding being
block 0) and, past the first sublayer of its block, the current block's partial sum::

    h_l = sum_n alpha_{n->l} b_n  over  [b_0 = h, b_1, ..., b_(m-1), b_m^partial]

Full AttnRes is Block AttnRes with blocks of one sublayer. Readout: one more AttnRes over every source with its
own zero-initialized pseudo-query and key norm, then ``N_f``.

State: :class:`DepthSources`, the completed blocks as a tuple of K ``(B, N, D)`` tensors and the current block's
partial sum ``(B, N, D)`` (ignored at a block's first sublayer, which replaces it), threaded through ``prepare`` /
``update`` like every other scheme's state.

Memory, linear in depth: each source is stored once, as the tensor its sublayer produced; a new block extends the
tuple (no copy of the earlier sources). A sublayer stacks its K sources ``(K, B, N, D)`` inside its prologue,
which ``recompute_norms`` (``"auto"``: on, ``recompute_wins``) or whole-block activation checkpointing recompute
in backward, so the stack and the keys ``N_k(V)`` live only while that sublayer runs: what backward keeps is the
sources themselves (``sum_k |b_k|``, linear), where concatenating the blocks into a new ``(K + 1, ...)`` tensor at
every block (the earlier form) kept one such tensor per block (quadratic). With ``recompute_norms: false`` and no
activation checkpointing, every sublayer keeps its own stack and keys for backward: quadratic by nature (each
sublayer's keys are its own key norm of all K sources); the compute, K sources read by each of the ~2L
sublayers, is quadratic in any form.

Source: the repository MoonshotAI/Attention-Residuals could not be fetched here; implemented from the paper's
equations and the README's published PyTorch pseudocode (``block_attn_res``: ``V = stack(blocks + [partial])``,
``K = norm(V)``, ``logits = w . K``, ``h = sum(softmax over sources * V)``; a per-sublayer ``proj`` (a
``Linear(D, 1)``'s weight: the pseudo-query) and ``norm`` before attention and before the MLP; the block's partial
sum ``partial + attn_out``, then ``+ mlp_out``), as its archived copies show it. The adaLN (DiT) form replaces
``N`` by the non-affine norm that is modulated, as for every scheme.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.schemes.base import DepthSources, NormScheme, Readout, Scheme, Site, register


def depth_attention(sources: Tensor, query: Tensor, key_norm: nn.Module) -> Tensor:
    """``sum_i softmax_i(w . N_k(v_i)) v_i`` over the sources ``(K, B, N, D)`` -> ``(B, N, D)``."""
    logits = key_norm(sources) @ query  # (K, B, N)
    return torch.einsum("kbn,kbnd->bnd", logits.softmax(dim=0), sources)


class AttnResSite(Scheme):
    """One sublayer of Block AttnRes with blocks of ``block_size`` sublayers (module docstring)."""

    readout: type[Readout]

    def __init__(self, site: Site, block_size: int) -> None:
        super().__init__(site)
        self.opens_block = site.index % block_size == 0  # its block's first sublayer: no partial sum yet
        self.closes_block = (site.index + 1) % block_size == 0 or site.index == 2 * site.depth - 1
        # The first sublayer has one source, the embedding: a softmax over one source is 1 whatever w and N_k are,
        # so it has neither (no parameter without a gradient: DDP would stop on it).
        self.first = site.index == 0
        self.query = None if self.first else nn.Parameter(torch.zeros(site.dim))  # w_l, the pseudo-query
        self.key_norm = None if self.first else site.norm()  # N_k
        self.norm = site.branch_norm()  # N, the sublayer's own input norm
        if not self.first:  # the keys N_k(V), their logits and the stacked sources need not be kept
            self.recompute_wins = True

    def init_state(self, h: Tensor) -> DepthSources:
        return DepthSources((h,), h)  # b_0 = the embedding; no open block yet

    def prepare(self, state: DepthSources) -> tuple[Tensor, DepthSources]:
        if self.first:
            return self.norm(state.blocks[0]), state  # h_0 = the embedding
        sources = state.blocks if self.opens_block else (*state.blocks, state.partial)
        return self.norm(depth_attention(torch.stack(sources), self.query, self.key_norm)), state

    def update(self, state: DepthSources, out: Tensor) -> DepthSources:
        partial = out if self.opens_block else state.partial + out
        if self.closes_block:
            return DepthSources((*state.blocks, partial), partial)  # the new source joins; nothing is copied
        return DepthSources(state.blocks, partial)


class AttnResReadout(Readout):
    """``N_f(AttnRes(every source))``: the last aggregation has its own pseudo-query and key norm."""

    def __init__(self, site: Site) -> None:
        super().__init__(site)
        self.query = nn.Parameter(torch.zeros(site.dim))
        self.key_norm = site.norm()
        self.norm_f = site.branch_norm()
        self.recompute_wins = True

    def forward(self, state: DepthSources) -> Tensor:
        return self.norm_f(depth_attention(torch.stack(state.blocks), self.query, self.key_norm))

    def streams(self, state: DepthSources) -> dict[str, Tensor]:
        return {f"b{i}": self.norm_f(b) for i, b in enumerate(state.blocks)}


@register(NormScheme.ATTN_RES)
class AttentionResiduals(AttnResSite):
    """Full AttnRes: every sublayer's output is a source of its own (blocks of one sublayer)."""

    readout = AttnResReadout

    def __init__(self, site: Site) -> None:
        super().__init__(site, 1)


@register(NormScheme.BLOCK_ATTN_RES)
class BlockAttentionResiduals(AttnResSite):
    """Block AttnRes with blocks of ``attn_res_block_size`` sublayers."""

    readout = AttnResReadout

    def __init__(self, site: Site) -> None:
        super().__init__(site, site.options.attn_res_block_size)
