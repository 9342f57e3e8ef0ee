"""A backward pass walked in Python, node by node, for fake CUDA tensors on a machine without a GPU.

torch's autograd engine cannot run a backward over fake ``cuda`` tensors without a CUDA device: before the
first node it records the caller's current stream of every device it will touch, and asks the CUDA driver
whether device 0 has a context (``hasPrimaryContext expects a valid device index``; pytorch/pytorch#92627,
whose fix allocates one real CUDA tensor first). Every functional route (``torch.func.grad``, AOTAutograd's
joint graph, compiled autograd) enters that same engine. So :func:`backward` does what the engine does, on
the graph the forward recorded, calling each node's own backward (the same C++ derivative formulas, the same
``autograd.Function.backward`` of the suite's custom functions):

    1. dependencies: how many edges point at each node, from ``loss.grad_fn`` through ``next_functions``
    2. a node runs once every gradient it waits for has arrived (its inputs summed per output slot, in the order
       they arrive); of the nodes ready, the one made last in forward first (the engine's ready queue: the
       largest sequence number), so gradients are summed in the engine's order and come out bitwise the same
    3. each gradient it returns is checked against what the next node recorded in forward
       (``_input_metadata``), as the engine's ``validate_outputs`` does: another device is an error naming
       the node; another dtype is cast to the recorded one; a broadcast shape is summed back
    4. ``AccumulateGrad`` nodes add into their leaf's ``.grad``

What it leaves out, against the engine: CUDA streams and events (none exist), tensor and node hooks
(``register_hook``, FSDP2's pre-backward hooks and the engine's final callbacks), ``retain_graph`` (the
graph's saved tensors are freed as nodes run only where a node frees them itself), and re-entrant backward.
Non-reentrant activation checkpointing works: its unpack hooks recompute the block when a node reads a saved
tensor, once per region since the walk runs as one ``GraphExecGroup`` (outside the engine each read would
otherwise count as a backward of its own and recompute the region again). A test checks the walk against the
engine on CPU tensors, gradient for gradient, for every scheme.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

import torch
from torch import Tensor
from torch.utils.checkpoint import GraphExecGroup


class BackwardDeviceError(RuntimeError):
    """A node's backward returned a gradient on another device than its input had in forward."""


def _graph(root: object) -> Counter:
    """For every node reachable from ``root``: how many edges point at it."""
    waiting: Counter = Counter()
    seen, stack = {root}, [root]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            waiting[nxt] += 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return waiting


def _zeros(meta: object) -> Tensor:
    return torch.zeros(tuple(meta.shape), dtype=meta.dtype, device=meta.device)


def _call(node: object, grads: list[Tensor | None]) -> list[tuple[object, int, Tensor | None]]:
    """Runs one node's backward; returns (next node, its input slot, gradient) for every edge."""
    if hasattr(node, "_forward_cls"):  # an autograd.Function: its Python backward, as the engine's PyNode calls it
        if getattr(node, "materialize_grads", True):
            grads = [_zeros(m) if g is None else g for g, m in zip(grads, node._input_metadata, strict=True)]
        outs = node.apply(*grads)  # BackwardCFunction.apply: the Function's backward (or vjp)
        outs = outs if isinstance(outs, tuple) else (outs,)
        # one output per forward input; the edges are the tensor inputs, and exactly the ones that needed a
        # gradient have a node (an input without one has a None edge, and its output is dropped)
        needed = [g for g, need in zip(outs, node.needs_input_grad, strict=False) if need]
        edges = [(nxt, slot) for nxt, slot in node.next_functions if nxt is not None]
        return [(nxt, slot, g) for (nxt, slot), g in zip(edges, needed, strict=True)]
    outs = node(*grads)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [(nxt, slot, g) for (nxt, slot), g in zip(node.next_functions, outs, strict=True) if nxt is not None]


def _validated(node: object, nxt: object, slot: int, grad: Tensor) -> Tensor:
    """``grad`` as the engine hands it on: on the recorded device (else an error), in the recorded dtype and shape."""
    meta = nxt._input_metadata[slot]
    if grad.device != meta.device:
        raise BackwardDeviceError(
            f"the backward of {node.name()} returned a gradient on {grad.device} for an input of {nxt.name()} "
            f"that was on {meta.device} in forward"
        )
    if grad.dtype != meta.dtype:
        grad = grad.to(meta.dtype)
    if tuple(grad.shape) != tuple(meta.shape):
        grad = grad.sum_to_size(tuple(meta.shape))
    return grad


def backward(loss: Tensor) -> int:
    """``loss.backward()`` walked in Python (module docstring): leaves' ``.grad`` accumulate as the engine would.

    Returns:
        The number of nodes run.

    Raises:
        BackwardDeviceError: a node returned a gradient on a device its input was not on.
        ValueError: ``loss`` is not a scalar with a ``grad_fn``.
    """
    root = loss.grad_fn
    if root is None or loss.numel() != 1:
        raise ValueError(f"backward needs a scalar loss with a grad_fn, got shape {tuple(loss.shape)}")
    waiting = _graph(root)
    pending: dict[object, list[Tensor | None]] = {root: [torch.ones_like(loss)]}
    order = itertools.count()  # ties (AccumulateGrad nodes share the largest sequence number): first come first
    ready, ran = [(-root._sequence_nr(), next(order), root)], 0
    with torch.no_grad(), GraphExecGroup():  # one recomputation per checkpointed region, as in one engine call
        while ready:
            *_, node = heapq.heappop(ready)
            grads = pending.pop(node, [None] * len(node._input_metadata))
            ran += 1
            variable = getattr(node, "variable", None)
            if variable is not None:  # AccumulateGrad
                (grad,) = grads
                if grad is not None:
                    variable.grad = grad if variable.grad is None else variable.grad + grad
                continue
            if all(g is None for g in grads):
                outs = [(nxt, slot, None) for nxt, slot in node.next_functions if nxt is not None]
            else:
                outs = _call(node, grads)
            for nxt, slot, grad in outs:
                if grad is not None:
                    grad = _validated(node, nxt, slot, grad)
                    buffer = pending.setdefault(nxt, [None] * len(nxt._input_metadata))
                    buffer[slot] = grad if buffer[slot] is None else buffer[slot] + grad
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    heapq.heappush(ready, (-nxt._sequence_nr(), next(order), nxt))
    return ran
