"""The shared transformer trunk: ``(B, N, D) -> (B, N, D)`` under any norm scheme.

A block is two residual sublayers, attention then MLP. Each sublayer asks its scheme site for the
branch input and hands the branch output back; adaLN-Zero conditioning (DiT) wraps the branch::

    inp, state = site.prepare(state)               # scheme: which norms, which streams
    inp = modulate(inp, shift, scale)              # conditioned only
    out = gate * F(inp)                            # conditioned only: gate; F = attn or MLP
    state = site.update(state, drop_path(out))     # scheme: how the streams absorb it

The first two lines are the sublayer's *prologue*. With ``recompute_norms`` it runs again in backward
(:func:`models.recompute.recomputed`) instead of keeping its norms' inputs and outputs; the matmuls of F keep
what they save. ``"auto"`` recomputes the sites whose prologue keeps more than its inputs and the branch input
(``Scheme.recompute_wins``), unless whole blocks are recomputed anyway (``activation_checkpointing``).
"""

from __future__ import annotations

import math

import torch
from timm.layers import DropPath
from torch import Tensor, nn

from models.config import TrunkConfig
from models.init_values import Fill, Init, Plan, draw_seed, initialize, rng_unchanged, trunc_normal_
from models.layers import AdaLNZero, Attention, Mlp, MoE, Routing, SwiGLU, modulate
from models.layers.moe import GroupedExperts
from models.olmo_init import input_std, olmo_normal_, output_std
from models.recompute import recomputed
from models.schemes import Readout, Scheme, Site, State, get_scheme
from models.schemes.mhc import PaperMHC


def build_ffn(cfg: TrunkConfig) -> nn.Module:
    """The MLP sublayer: dense GELU / SwiGLU, or a SwiGLU mixture of experts."""
    if cfg.moe_experts:
        hidden = cfg.moe_hidden or cfg.hidden
        return MoE(cfg.dim, hidden, cfg.moe_experts, cfg.moe_top_k, cfg.moe_normalize_topk)
    if cfg.mlp == "swiglu":
        return SwiGLU(cfg.dim, cfg.hidden, bias=cfg.bias)
    return Mlp(cfg.dim, cfg.hidden, bias=cfg.bias, approximate="tanh" if cfg.mlp == "gelu_tanh" else "none")


def zeros(t: Tensor, generator: torch.Generator) -> None:
    """The fill of biases and of zero-initialized layers (draws nothing)."""
    t.zero_()


def xavier(t: Tensor, generator: torch.Generator) -> None:
    """Xavier-uniform over the last two axes (each leading index its own matrix)."""
    for m in t.view(-1, *t.shape[-2:]):
        nn.init.xavier_uniform_(m, generator=generator)


def olmo_fill(std: float) -> Fill:
    """OLMo's truncated normal (``+- 3 std``) with ``std``."""
    return lambda t, generator: olmo_normal_(t, std, generator=generator)


def matrix_fill(cfg: TrunkConfig) -> Fill:
    """Step 1 of :meth:`Trunk.init_plan` for a weight ``(out, in)``, or ``(E, in, out)`` for MoE experts."""
    if cfg.init == "xavier":
        return xavier
    if cfg.init == "normal":
        return lambda t, generator: nn.init.normal_(t, std=cfg.init_std, generator=generator)
    if cfg.init in ("mitchell", "olmo_normal"):
        return olmo_fill(input_std(cfg.dim) if cfg.init == "mitchell" else cfg.init_std)
    return lambda t, generator: trunc_normal_(t, cfg.init_std, -2.0, 2.0, generator)  # timm's absolute +-2


def scaled(fill: Fill, factors: tuple[tuple[int, float], ...] | list[tuple[int, float]]) -> Fill:
    """``fill``, then rows ``first:`` multiplied by ``factor`` for each ``(first, factor)`` (a factor 1 skipped)."""
    factors = [(first, factor) for first, factor in factors if factor != 1.0]
    if not factors:
        return fill

    def fill_scaled(t: Tensor, generator: torch.Generator) -> None:
        fill(t, generator)
        for first, factor in factors:
            t[first:].mul_(factor)

    return fill_scaled


def recompute_site(cfg: TrunkConfig, site: Scheme | Readout) -> bool:
    """Whether ``site``'s prologue (or the readout) is recomputed in backward under ``cfg.recompute_norms``."""
    if cfg.recompute_norms == "auto":
        return site.recompute_wins and not cfg.activation_checkpointing
    return bool(cfg.recompute_norms)


def prologue(state: State, site: Scheme, shift: Tensor | None, scale: Tensor | None) -> tuple[Tensor, State]:
    """The branch input of ``site`` (modulated in adaLN mode) and the state ``update`` will receive."""
    inp, state = site.prepare(state)
    return (inp if shift is None else modulate(inp, shift, scale)), state


class Block(nn.Module):
    """One transformer block: attention and MLP sublayers, each behind a scheme site."""

    def __init__(self, cfg: TrunkConfig, index: int, conditioned: bool = False, drop_path: float = 0.0):
        super().__init__()
        scheme = get_scheme(cfg.norm_scheme)

        def site(s: int, kind: str) -> Site:
            eps = cfg.mlp_norm_eps if kind == "mlp" and cfg.mlp_norm_eps is not None else cfg.norm_eps
            opts = cfg.scheme_options
            return Site(cfg.dim, s, cfg.depth, kind, cfg.norm_layer, eps, conditioned, opts, cfg.dyt_init(kind))

        self.attn_res: Scheme = scheme(site(2 * index, "attn"))
        self.attn = Attention(
            cfg.dim,
            cfg.num_heads,
            cfg.bias,
            cfg.qk_norm,
            scheme.qkv_norm,
            cfg.norm_layer,
            cfg.norm_eps,
            cfg.attn_drop,
            cfg.qk_norm_scope,
            cfg.dyt_init("qk"),
            cfg.num_kv_heads,
        )
        self.mlp_res: Scheme = scheme(site(2 * index + 1, "mlp"))
        self.mlp = build_ffn(cfg)
        self.is_moe = bool(cfg.moe_experts)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.adaLN = AdaLNZero(cfg.dim, 6) if conditioned else None
        self.recompute = (recompute_site(cfg, self.attn_res), recompute_site(cfg, self.mlp_res))

    def forward(
        self,
        state: State,
        cond: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
    ) -> tuple[State, Routing | None]:
        """Returns the new state and this block's routing (MoE load-balancing loss and expert loads; None if dense)."""
        mods = self.adaLN(cond) if self.adaLN is not None else (None,) * 6
        inp, state = self._prologue(0, self.attn_res, state, mods[0], mods[1])
        out = self.attn(inp, rope=rope, is_causal=is_causal)
        state = self.attn_res.update(state, self._gate(out, mods[2]))

        inp, state = self._prologue(1, self.mlp_res, state, mods[3], mods[4])
        out = self.mlp(inp)
        out, routing = out if self.is_moe else (out, None)
        state = self.mlp_res.update(state, self._gate(out, mods[5]))
        return state, routing

    def _prologue(
        self, sublayer: int, site: Scheme, state: State, shift: Tensor | None, scale: Tensor | None
    ) -> tuple[Tensor, State]:
        if self.recompute[sublayer] and torch.is_grad_enabled():
            return recomputed(prologue, state, site, shift, scale, reads=site.prologue_reads)
        return prologue(state, site, shift, scale)

    def _gate(self, out: Tensor, gate: Tensor | None) -> Tensor:
        return self.drop_path(out if gate is None else gate * out)


class Trunk(nn.Module):
    """L blocks under one norm scheme, plus the scheme's readout. No embeddings, no heads.

    Args:
        cfg: shape and scheme.
        conditioned: adaLN-Zero mode (DiT): ``forward`` then needs ``cond`` of shape ``(B, D)``.
        initialize: draw the init seed (one draw from the global generator, which is otherwise left as it was)
            and initialize; False when the network around the trunk initializes it (its plan includes
            :meth:`init_plan`).
    """

    def __init__(self, cfg: TrunkConfig, conditioned: bool = False, initialize: bool = True) -> None:
        super().__init__()
        if not (cfg.adaln_zero_init or conditioned):
            raise ValueError("trunk adaln_zero_init=false needs a conditioned (DiT) trunk; this one has no adaLN")
        self.cfg, self.conditioned = cfg, conditioned
        self.init_seed = draw_seed() if initialize else None
        with rng_unchanged():  # the constructors' draws are discarded: the plan gives every random value
            self._build(cfg, conditioned)
        if initialize:
            self.init_weights()

    def _build(self, cfg: TrunkConfig, conditioned: bool) -> None:
        self.scheme = get_scheme(cfg.norm_scheme)
        rates = [cfg.drop_path * b / max(cfg.depth - 1, 1) for b in range(cfg.depth)]  # grows with depth
        self.blocks = nn.ModuleList(Block(cfg, b, conditioned, rates[b]) for b in range(cfg.depth))
        readout_site = Site(
            cfg.dim,
            2 * cfg.depth,
            cfg.depth,
            "readout",
            cfg.norm_layer,
            cfg.norm_eps,
            conditioned,
            cfg.scheme_options,
            cfg.dyt_init("readout"),
        )
        self.readout = self.scheme.readout(readout_site)
        self.recompute_readout = recompute_site(cfg, self.readout)

    def init_weights(self) -> None:
        """Gives every parameter of :meth:`init_plan` its value at ``self.init_seed`` (models/init_values.py).

        Raises:
            ValueError: a trunk built with ``initialize=False``: the network around it owns the seed.
        """
        if self.init_seed is None:
            raise ValueError("this trunk is initialized by the network around it (initialize=False): use its init_plan")
        initialize(self, self.init_plan(), self.init_seed)

    def init_plan(self) -> Plan:
        """Every init decision of the trunk, in one place, as one fill per random parameter (names relative to the
        trunk; each draws from its own generator, models/init_values.py).

        1. Linear weights: trunc-normal / normal with ``init_std``, xavier-uniform, or OLMo's truncated normals
           (``mitchell``: ``1 / sqrt(d)``; ``olmo_normal``: ``init_std``; models/olmo_init.py); biases zero.
           mHC's stream projection ``hc_fn``: xavier-uniform, as its constructor draws it.
        2. GPT-2 recipe (``scaled_output_init``): residual output projections get ``std / sqrt(2L)``; Mitchell's:
           with ``init: mitchell`` block l's output projections are drawn with ``1 / sqrt(2 fan_in (l + 1))``
           instead.
        3. The scheme's branch gain (DeepNorm's beta) scales value, attention-output and MLP weights.
        4. Norm scales start at 1 and shifts at 0 (their own defaults, outside the plan; DyT's alpha at its site's
           value); adaLN-Zero layers start at zero (``adaln_zero_init`` true or "blocks"), or (false: DyT's DiT
           port) keep step 1's init.
        """
        cfg = self.cfg
        matrix = matrix_fill(cfg)
        draws: dict[str, Fill] = {}
        for prefix, module in self.named_modules():
            at = f"{prefix}." if prefix else ""
            if isinstance(module, nn.Linear):
                draws[f"{at}weight"] = matrix
                if module.bias is not None:
                    draws[f"{at}bias"] = zeros
            elif isinstance(module, GroupedExperts):
                draws[f"{at}w_in"] = draws[f"{at}w_out"] = matrix
            elif isinstance(module, PaperMHC):
                draws[f"{at}hc_fn"] = xavier
        scales: dict[str, list[tuple[int, float]]] = {}  # name -> (first row, factor) multiplied after the draw
        gain = self.scheme.branch_init_gain(cfg.depth)
        out_gain = gain / math.sqrt(2 * cfg.depth) if cfg.scaled_output_init and cfg.init != "mitchell" else gain
        for layer_id, block in enumerate(self.blocks):
            at = f"blocks.{layer_id}."
            moe = isinstance(block.mlp, MoE)
            ffn_in, ffn_out = (f"{at}mlp.experts.w_in", f"{at}mlp.experts.w_out") if moe else (
                f"{at}mlp.fc1.weight", f"{at}mlp.fc2.weight")  # fmt: skip
            if cfg.init == "mitchell" and cfg.scaled_output_init:
                draws[f"{at}attn.proj.weight"] = olmo_fill(output_std(cfg.dim, layer_id))  # attn_out
                out = block.mlp.w_out if moe else block.mlp.fc2.weight
                draws[ffn_out] = olmo_fill(output_std(out.shape[-2] if moe else out.shape[-1], layer_id))  # ff_out
            scales[f"{at}attn.qkv.weight"] = [(cfg.dim + block.attn.kv_dim, gain)]  # the value rows of the fused QKV
            scales[f"{at}attn.proj.weight"] = [(0, out_gain)]
            scales[ffn_in], scales[ffn_out] = [(0, gain)], [(0, out_gain)]
            if block.adaLN is not None and cfg.adaln_zero_init:
                draws[f"{at}adaLN.net.1.weight"] = draws[f"{at}adaLN.net.1.bias"] = zeros
        shapes = {name: tuple(p.shape) for name, p in self.named_parameters()}
        return {name: Init(shapes[name], scaled(fill, scales.get(name, ()))) for name, fill in draws.items()}

    def forward(
        self,
        h: Tensor,
        cond: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
        return_aux: bool = False,
        skip_blocks: frozenset[int] = frozenset(),
    ) -> Tensor | tuple[Tensor, Routing]:
        """Runs the blocks and the readout.

        Args:
            h: embedded tokens, ``(B, N, D)``.
            cond: conditioning vector ``(B, D)``; required iff the trunk is conditioned.
            rope: rotary tables from :func:`models.layers.rope_tables`, or None.
            is_causal: causal attention mask (LM).
            return_aux: also return the auxiliary outputs, :class:`models.layers.Routing`: the load-balancing loss
                and the router z-loss, each summed over the MoE layers (0 for a dense trunk; ``mean_loss`` /
                ``mean_z`` average them as OLMoE weights them), and the expert loads stacked ``(L_moe, E)``.
            skip_blocks: block indices to skip (layer-pruning sensitivity).
        """
        if (cond is None) == self.conditioned:
            raise ValueError("cond is required for a conditioned trunk and must be None otherwise")
        state, aux = self.forward_state(h, cond, rope, is_causal, skip_blocks)
        if self.recompute_readout and torch.is_grad_enabled():
            out = recomputed(self.readout, state)
        else:
            out = self.readout(state)
        return (out, aux) if return_aux else out

    def init_state(self, h: Tensor) -> State:
        """The residual state built from the embedding ``h``, ``(B, N, D)``: the first site's scheme builds it
        (a multi-stream scheme knows its stream count from the trunk config)."""
        return self.blocks[0].attn_res.init_state(h)

    def forward_state(
        self,
        h: Tensor,
        cond: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        is_causal: bool = False,
        skip_blocks: frozenset[int] = frozenset(),
    ) -> tuple[State, Routing]:
        """The final residual state (before the readout) and the routing of the MoE layers that ran."""
        state = self.init_state(h)
        aux = h.new_zeros((), dtype=torch.float32)
        z = h.new_zeros((), dtype=torch.float32)
        loads = []
        for b, block in enumerate(self.blocks):
            if b in skip_blocks:
                continue
            if self.cfg.activation_checkpointing and self.training:  # drop-path draws: replay the RNG
                state, routing = recomputed(block, state, cond, rope, is_causal, preserve_rng_state=True)
            else:
                state, routing = block(state, cond, rope, is_causal)
            if routing is not None:  # dense blocks add nothing to the hot path
                aux = aux + routing.loss
                z = z + routing.z
                loads.append(routing.load)
        load = torch.stack(loads) if loads else h.new_zeros((0, 0), dtype=torch.float32)  # (L_moe, E)
        return state, Routing(aux, load, z)
