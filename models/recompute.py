"""Recomputed norms: a scheme's prologue (its norms and element-wise ops, up to the branch input) runs again
in backward instead of keeping its intermediates, while the matmul outputs around it stay saved.

Built on ``torch.utils.checkpoint`` (non-reentrant), so it composes with full activation checkpointing (it
nests), ``torch.compile`` (the region becomes a must-recompute tag for the partitioner), DDP and FSDP. The
forward is the same computation, so its bits are unchanged; backward gets the same gradients up to rounding.

A checkpoint keeps every tensor it is given until backward, so only the streams the function reads go in
(``reads``); the others pass around the region. They go in as separate tensors, not as a NamedTuple:
checkpoint stores tensor arguments as saved tensors (visible to ``saved_tensors_hooks``, and so to the
benchmark's memory count) but keeps other arguments as plain references.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from torch import Tensor
from torch.utils.checkpoint import checkpoint

from models.schemes import State

T = TypeVar("T")


def recomputed(
    fn: Callable[..., T],
    state: State,
    *args,
    reads: Sequence[str] | None = None,
    preserve_rng_state: bool = False,
) -> T:
    """``fn(state, *args)``, with everything ``fn`` computes recomputed in backward.

    Args:
        fn: a pure function of the residual state and ``args`` (modules may be among the ``args``); it returns
            either any value, or (with ``reads``) a pair ``(value, new state)``.
        state: a tensor or a NamedTuple of tensors; each tensor ``fn`` reads is kept once for the recomputation.
        args: further arguments, tensors or not.
        reads: the fields of a NamedTuple ``state`` that ``fn`` reads; the others ``fn`` must pass through
            unchanged: inside the region they are None, and the new state gets them back outside it.
        preserve_rng_state: replay the RNG in the recomputation (needed only when ``fn`` draws random numbers).
    """
    if isinstance(state, Tensor):
        return checkpoint(fn, state, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state)
    kind, names = type(state), state._fields
    inside = tuple(names if reads is None else reads)
    outside = {name: getattr(state, name) for name in names if name not in inside}
    # A field may be a tuple of tensors (Attention Residuals' sources): each goes in as a tensor of its own
    lengths = [len(v) if isinstance(v, tuple) else None for v in (getattr(state, name) for name in inside)]
    parts = [t for name in inside for t in _flat(getattr(state, name))]

    def region(*flat):
        fields, at = {}, 0
        for name, length in zip(inside, lengths, strict=True):
            fields[name] = flat[at] if length is None else tuple(flat[at : at + length])
            at += 1 if length is None else length
        return fn(kind(**fields, **dict.fromkeys(outside)), *flat[at:])

    out = checkpoint(region, *parts, *args, use_reentrant=False, preserve_rng_state=preserve_rng_state)
    if not outside:
        return out
    value, new_state = out
    return value, new_state._replace(**outside)


def _flat(value: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)
