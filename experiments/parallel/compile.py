"""Compiled training: each trunk Block compiled on its own, in torchtitan's order.

    tensor / expert parallelism    experiments.parallel.tensor / expert (per Block, in place)
    activation checkpointing       the trunk's switch (``trunk.activation_checkpointing``), moved into each Block:
                                   ``recomputed(Block.forward, ...)``, the trunk's own recomputation
    compile                        :func:`compile_blocks`: each Block's (recomputed) forward compiled on its own
                                   (torchtitan's ``apply_compile``, torchtitan/distributed/compile.py, compiles
                                   each TransformerBlock after ``apply_ac`` wrapped it)
    FSDP2                          ``fully_shard`` per Block, then the root (experiments.parallel.shard)

The Block's ``forward`` is compiled in place (torchtitan calls ``block.compile()``, whose compiled call holds the
module's hooks, which dynamo skips for FSDP2's; here they run eagerly around the compiled forward, the same
thing): parameter names, state dicts and checkpoints are the eager ones (no ``_orig_mod.`` prefix). The Blocks
repeat one structure, so they share the compiled code where their constants agree (dynamo guards on shapes and
on Python constants such as a scheme's per-layer scale, not on the module). Graph breaks are allowed (torchtitan asks
for ``fullgraph``): in an MoE Block whose experts are split over ranks, the experts' grouped matmuls and the
expert-parallel exchange around them (``GroupedExperts`` and its all-to-all hooks) run eagerly between compiled
regions. Their row counts are data: compiled, each step's counts recompiled the graph with dynamic shapes
(pytorch/pytorch#166926 is what that does to a recomputation); the grouped matmul is one kernel already, so
compiling it fuses nothing. Under activation checkpointing that break lies inside the compiled checkpoint, which
cannot hold one: such Blocks run eagerly as a whole (torchtitan's open "TODO: Fix Compile(AC(graph break))"), and
:func:`compile_blocks` warns. Experts not split are traced with the Block (``models.layers.moe.grouped_matmul``
needs no host read under compile).
``capture_scalar_outputs`` is on, as torchtitan sets it for token-choice MoE dispatch.

Under ``ModelParallelStrategy`` :func:`~experiments.parallel.shard.parallelize` calls :func:`compile_blocks` between
the model-parallel styles and FSDP2; every other strategy (single device, DDP) gets it from the task's
``configure_model``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from experiments.parallel.config import ParallelConfig
from models.layers.moe import GroupedExperts
from models.recompute import recomputed

COMPILED = "_compiled_blocks"  # attribute on the trunk: compile_blocks ran (configure_model runs at every stage)


def compile_blocks(trunk: nn.Module, config: ParallelConfig) -> bool:
    """Compiles every Block of ``trunk`` in place when ``config.compile`` is on; returns whether it did.

    Under activation checkpointing the recomputation moves inside the compiled region, as torchtitan orders it
    (checkpoint wraps the Block, compile wraps that): each Block's forward becomes a compiled
    ``recomputed(forward, ...)`` (the trunk's own function, the RNG replayed), and the trunk's per-call
    recomputation is switched off on this trunk's config copy (``trunk.cfg``; the task's config keeps the
    setting). Checkpointing outside a compiled Block replays compiled code in backward, and under FSDP2 a
    two-stream scheme's replay saved other tensors than its forward (torch refuses: "Recomputed values ... have
    different metadata"); inside, the compiled backward recomputes what the compiled forward dropped.

    Args:
        trunk: a :class:`models.trunk.Trunk` (``blocks`` and ``cfg``), after tensor / expert parallelism and before
            FSDP2.
        config: ``compile`` (on or off) and ``compile_backend`` (torch.compile's backend: "inductor", the default,
            generates fused kernels; "aot_eager" traces forward and backward as inductor does but runs torch's own
            kernels, which the CPU tests use; "eager" only captures the graph).
    """
    if not config.compile or getattr(trunk, COMPILED, False):
        return False
    torch._dynamo.config.capture_scalar_outputs = True  # the MoE's data-dependent token counts (torchtitan's setting)
    split = [m for m in trunk.modules() if isinstance(m, GroupedExperts) and isinstance(m.w_in, DTensor)]
    for experts in split:  # split over ranks: the exchange's split sizes are read on the host
        experts.forward = torch.compiler.disable(experts.forward)
    cfg = getattr(trunk, "cfg", None)
    checkpointing = bool(getattr(cfg, "activation_checkpointing", False))
    if split and checkpointing:
        from lightning.pytorch.utilities import rank_zero_warn  # here: plain gradient code does not load Lightning

        rank_zero_warn(
            "parallel.compile with expert parallelism and activation checkpointing: the MoE Blocks run eagerly (the "
            "expert exchange is a graph break inside the compiled checkpoint, which cannot hold one)"
        )
    if checkpointing:
        trunk.cfg = dataclasses.replace(cfg, activation_checkpointing=False)  # the Blocks recompute themselves
    for block in trunk.blocks:
        forward = _recomputing(block, block.forward) if checkpointing else block.forward
        block.forward = torch.compile(forward, backend=config.compile_backend)
    setattr(trunk, COMPILED, True)
    return True


def _recomputing(block: nn.Module, forward: Callable) -> Callable:
    """``forward`` recomputed in backward while ``block`` trains, as ``Trunk.forward_state`` does it."""

    def run(state, *args):
        if block.training and torch.is_grad_enabled():
            return recomputed(forward, state, *args, preserve_rng_state=True)  # drop-path draws: replay the RNG
        return forward(state, *args)

    return run


def is_compiled(trunk: nn.Module) -> bool:
    """Whether :func:`compile_blocks` compiled ``trunk``'s Blocks."""
    return bool(getattr(trunk, COMPILED, False))
