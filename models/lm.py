"""Causal language model: token embedding -> causal trunk (RoPE) -> LM head."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.config import TrunkConfig
from models.init_values import Init, Plan, draw_seed, initialize, prefixed, rng_unchanged
from models.layers import Routing, rope_tables
from models.olmo_init import input_std, olmo_normal_
from models.trunk import Trunk


class LanguageModel(nn.Module):
    """A decoder-only transformer over the shared trunk.

    ``trunk.learned_embed_scale`` multiplies the token embedding by a learnable scalar that starts at ``sqrt(D)``
    (DyT's LLaMA port: ``x = shared(ids) * shared_scale``, ``shared_scale`` filled with ``sqrt(emb_dim)``).

    Args:
        trunk: trunk shape and norm scheme (``mlp="swiglu"``, ``moe_experts > 0`` for MoE).
        vocab_size: tokenizer vocabulary size.
        max_seq_len: longest sequence RoPE tables are built for.
        tie_embeddings: share the input embedding with the output head.
        rope_base: RoPE base frequency.
        init_seed: the seed of every initial value (models/init_values.py); None draws it from the global
            generator (one draw; what the constructors draw besides is discarded).
    """

    def __init__(
        self,
        trunk: TrunkConfig,
        vocab_size: int,
        max_seq_len: int = 2048,
        tie_embeddings: bool = False,
        rope_base: float = 10000.0,
        init_seed: int | None = None,
    ) -> None:
        super().__init__()
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.cfg, self.vocab_size, self.max_seq_len, self.rope_base = trunk, vocab_size, max_seq_len, rope_base
        self.tie_embeddings = tie_embeddings
        self.init_seed = draw_seed() if init_seed is None else init_seed
        with rng_unchanged():  # the constructors' draws are discarded: init_plan gives every random value
            self.embed = nn.Embedding(vocab_size, trunk.dim)
            scale = nn.Parameter(torch.full((1,), math.sqrt(trunk.dim))) if trunk.learned_embed_scale else None
            self.embed_scale = scale
            self.trunk = Trunk(trunk, initialize=False)
            self.head = nn.Linear(trunk.dim, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(max_seq_len, trunk.dim // trunk.num_heads, rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        initialize(self, self.init_plan(), self.init_seed)

    def init_plan(self) -> Plan:
        """The trunk's plan (:meth:`models.trunk.Trunk.init_plan`), the token embedding and the untied head:
        normal with ``init_std``, or OLMo's rules (``mitchell``: ``1 / sqrt(d)``, ``olmo_normal``: ``init_std``,
        truncated at 3 std: models/olmo_init.py)."""
        cfg = self.cfg
        std = input_std(cfg.dim) if cfg.init == "mitchell" else cfg.init_std  # OLMo's wte and ff_out rules
        if cfg.init in ("mitchell", "olmo_normal"):
            fill = lambda t, generator: olmo_normal_(t, std, generator=generator)  # noqa: E731
        else:
            fill = lambda t, generator: nn.init.normal_(t, std=std, generator=generator)  # noqa: E731
        plan = {**prefixed("trunk", self.trunk.init_plan()), "embed.weight": Init(tuple(self.embed.weight.shape), fill)}
        if not self.tie_embeddings:
            plan["head.weight"] = Init(tuple(self.head.weight.shape), fill)
        return plan

    def forward(
        self, idx: Tensor, return_aux: bool = False, skip_blocks: frozenset[int] = frozenset()
    ) -> Tensor | tuple[Tensor, Routing]:
        """Next-token logits ``(B, N, V)`` for token ids ``(B, N)`` (and the MoE routing: aux loss, expert loads)."""
        hidden, aux = self.forward_features(idx, skip_blocks)
        logits = self.head(hidden)
        return (logits, aux) if return_aux else logits

    def forward_features(self, idx: Tensor, skip_blocks: frozenset[int] = frozenset()) -> tuple[Tensor, Routing]:
        """Trunk output ``(B, N, D)`` and the routing (:class:`models.layers.Routing`)."""
        if idx.shape[1] > self.max_seq_len:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds max_seq_len {self.max_seq_len}")
        h = self.embed(idx) if self.embed_scale is None else self.embed(idx) * self.embed_scale  # (B, N, D)
        return self.trunk(
            h,
            rope=(self.rope_cos, self.rope_sin),
            is_causal=True,
            return_aux=True,
            skip_blocks=skip_blocks,
        )

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Tensor:
        """Samples ``max_new_tokens`` continuations of ``idx`` (``temperature=0`` is greedy).

        ``should_stop`` is asked before every token; once it says True the tokens so far are returned (a
        run told to stop, e.g. by SIGTERM, does not finish a long generation first).
        """
        for _ in range(max_new_tokens):
            if should_stop is not None and should_stop():
                break
            logits = self(idx[:, -self.max_seq_len :])[:, -1]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
