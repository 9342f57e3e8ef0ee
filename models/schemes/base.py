"""The residual-scheme protocol, its registry, and the typed stream states.

A *scheme* is where the norms sit around each residual sublayer. One scheme instance lives at
every residual site (each attention and each MLP sublayer of every block) and owns that site's
norm parameters; a matching *readout* turns the final state into the trunk's output. The block
loop only ever calls::

    branch_input, state = site.prepare(state)   # what the sublayer F reads
    state = site.update(state, F(branch_input))  # how F's output is written back

so it never knows how many residual streams exist. States are plain tensors or NamedTuples of
tensors, never attributes on ``self``: the protocol is pure, which keeps activation
checkpointing, ``torch.compile``, DDP and FSDP working.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar, Literal, NamedTuple

from torch import Tensor, nn

from models.norms import DyTInit, build_norm


class NormScheme(StrEnum):
    """Every normalization placement the suite implements (equations: README, "The norm schemes")."""

    PRE = "pre"
    POST = "post"
    PERI = "peri"
    DEEPNORM = "deepnorm"
    MIXLN = "mixln"
    HYBRID = "hybrid"
    RESI_DUAL = "resi_dual"
    HYPER = "hyper"
    RESI_DUAL_HYBRID = "resi_dual_hybrid"
    SIAMESE = "siamese"
    SIAMESE_HYBRID = "siamese_hybrid"
    MHC = "mhc"
    LNS = "lns"
    REORDERED = "reordered"
    KEEL = "keel"
    ATTN_RES = "attn_res"
    BLOCK_ATTN_RES = "block_attn_res"


class TwoStream(NamedTuple):
    """SiameseNorm's state: the Post-Norm-like X stream and the Pre-Norm-like Y stream."""

    post: Tensor
    pre: Tensor


class DualStream(NamedTuple):
    """ResiDual's state: the Post-LN stream and the running sum of raw branch outputs."""

    post: Tensor
    delta: Tensor


class HybridDual(NamedTuple):
    """ResiDual's topology with a HybridNorm main stream: that stream and the sum of raw branch outputs."""

    hybrid: Tensor
    delta: Tensor


class DepthSources(NamedTuple):
    """Attention Residuals' state: the completed blocks, a tuple of K ``(B, N, D)`` tensors (the embedding first),
    each stored once and never copied into a stack that outlives a sublayer, and the open block's partial sum
    ``(B, N, D)``."""

    blocks: tuple[Tensor, ...]
    partial: Tensor


State = Tensor | TwoStream | DualStream | HybridDual | DepthSources
SiteKind = Literal["attn", "mlp", "readout"]


@dataclass(frozen=True)
class SchemeOptions:
    """Scheme-specific switches; each is read by exactly one scheme.

    Attributes:
        mix_ratio: Mix-LN: the first ``floor(mix_ratio * L)`` blocks are Post-Norm, the rest Pre-Norm.
        input_norm: SiameseNorm ablation: keep the branch-input norm ``N_in`` (paper Table 3).
        depth_scaling: SiameseNorm ablation: scale the X-stream update by ``1 / sqrt(2(b + 1))``.
        hybrid_depth_scaling: HybridNorm ablation (paper Table 3): scale its single stream's update by
            ``1 / sqrt(2(b + 1))``, the depth scaling SiameseNorm applies to its X stream.
        mhc_streams: mHC's number of residual streams n.
        mhc_variant: mHC's form: "paper" (one projection of the flattened streams, DeepSeek-V4's Sinkhorn) or
            "mhcv2" (lucidrains' mHCv2: each stream normalized and projected on its own).
        attn_res_block_size: Block AttnRes: sublayers per block (2: one transformer block per source).
    """

    mix_ratio: float = 0.25
    input_norm: bool = True
    depth_scaling: bool = True
    hybrid_depth_scaling: bool = False
    mhc_streams: int = 4
    mhc_variant: str = "paper"
    attn_res_block_size: int = 2


@dataclass(frozen=True)
class Site:
    """Where a scheme instance sits, and how it builds its norms.

    Attributes:
        dim: model width D.
        index: 0-based sublayer index s (``2 * depth`` for the readout).
        depth: number of blocks L.
        kind: "attn", "mlp" or "readout".
        norm_layer: "layernorm", "rmsnorm" or "dyt".
        norm_eps: epsilon of every norm.
        conditioned: adaLN-Zero mode (DiT): branch inputs go through a non-affine norm + modulate.
        options: scheme-specific switches.
        dyt: how this site's norms start when they are DyT (alpha per site kind: ``TrunkConfig.dyt_init``).
    """

    dim: int
    index: int
    depth: int
    kind: SiteKind
    norm_layer: str = "layernorm"
    norm_eps: float = 1e-6
    conditioned: bool = False
    options: SchemeOptions = SchemeOptions()
    dyt: DyTInit = DyTInit()

    @property
    def block(self) -> int:
        """0-based block index b = s // 2."""
        return self.index // 2

    @property
    def depth_scale(self) -> float:
        """SiameseNorm's depth scaling ``c = sqrt(2 (b + 1))``, the same for both sublayers of block b."""
        return math.sqrt(2 * (self.block + 1))

    def norm(self) -> nn.Module:
        """A fresh affine norm N(.)."""
        return build_norm(self.norm_layer, self.dim, self.norm_eps, affine=True, dyt=self.dyt)

    def branch_norm(self) -> nn.Module:
        """The scheme's own branch-input norm; conditioned mode replaces it by a non-affine one."""
        return build_norm(self.norm_layer, self.dim, self.norm_eps, affine=not self.conditioned, dyt=self.dyt)

    def cond_norm(self) -> nn.Module:
        """For schemes without a branch-input norm: identity, or the non-affine norm adaLN needs."""
        if not self.conditioned:
            return nn.Identity()
        return build_norm(self.norm_layer, self.dim, self.norm_eps, affine=False, dyt=self.dyt)


class Scheme(nn.Module):
    """One residual site. Subclasses implement the scheme's equation in ``prepare``/``update``."""

    name: ClassVar[NormScheme]
    #: Attention of this scheme normalizes Q, K and V per head after projection (HybridNorm).
    qkv_norm: ClassVar[bool] = False
    #: The module class that turns the final state into the trunk output.
    readout: ClassVar[type[Readout]]
    #: The fields of a NamedTuple state ``prepare`` reads; it passes the others through unchanged (None: all).
    prologue_reads: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, site: Site) -> None:
        super().__init__()
        self.site_index = site.index
        #: Recomputing ``prepare`` (and adaLN's modulate) in backward keeps fewer bytes than saving it, i.e. the
        #: prologue keeps more than its input streams and the branch input (``recompute_norms="auto"`` reads it;
        #: tests/models/test_recompute.py checks it against the bytes autograd saves). By default only adaLN's:
        #: there the non-affine norm's output is kept by modulate's multiply. Schemes with more set it True.
        self.recompute_wins = site.conditioned

    def init_state(self, h: Tensor) -> State:
        """The residual state built from the embedding ``h`` (asked of the first site): one stream by default."""
        return h

    def prepare(self, state: State) -> tuple[Tensor, State]:
        raise NotImplementedError

    def update(self, state: State, out: Tensor) -> State:
        raise NotImplementedError

    @classmethod
    def branch_init_gain(cls, depth: int) -> float:
        """Factor applied at init to value, attention-output and MLP weights (DeepNorm's beta)."""
        return 1.0


class Readout(nn.Module):
    """Maps the final residual state to one ``(B, N, D)`` tensor."""

    def __init__(self, site: Site) -> None:
        super().__init__()
        self.recompute_wins = False  # as Scheme.recompute_wins, for the readout

    def forward(self, state: State) -> Tensor:
        raise NotImplementedError

    def streams(self, state: State) -> dict[str, Tensor]:
        """Each stream's own readout (for the per-stream logit lens); one entry for one stream."""
        return {"x": self.forward(state)}


SCHEMES: dict[NormScheme, type[Scheme]] = {}


def register(name: NormScheme):
    """Class decorator adding a scheme to :data:`SCHEMES` under ``name``."""

    def wrap(cls: type[Scheme]) -> type[Scheme]:
        cls.name = name
        SCHEMES[name] = cls
        return cls

    return wrap


@functools.cache
def scheme_names() -> str:
    return ", ".join(s.value for s in NormScheme)


def get_scheme(name: str | NormScheme) -> type[Scheme]:
    """The registered scheme class for ``name``.

    Raises:
        ValueError: for an unknown scheme, listing the valid ones.
    """
    try:
        return SCHEMES[NormScheme(name)]
    except ValueError:
        raise ValueError(f"unknown norm_scheme {name!r}; valid: {scheme_names()}") from None
