"""An MoE block recomputed by activation checkpointing inside ``torch.compile`` (the order compiled training uses:
checkpoint wraps the block, compile wraps that) traces into graphs with no graph break, and its output, auxiliary
loss and gradients equal eager ones.

A compiled checkpoint is one higher-order op: a graph break anywhere inside it (a function dynamo skips, a count read
on the host) sends the whole region back to eager, silently, with 0 graphs. Hence the counts of graphs and breaks.
Not ``fullgraph=True``: it would turn on ``capture_scalar_outputs`` and so let a host read of a count through.
"""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from models.layers import MoE
from models.recompute import recomputed

DIM, HIDDEN, EXPERTS, TOP_K = 16, 16, 4, 2  # rows of 64 bytes: eagerly, float32 on CPU takes torch._grouped_mm


def block(moe: MoE, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, routing = moe(h)
    return h + out, routing.loss + routing.z


def loss_and_grads(fn, moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_()
    out, aux = fn(x)
    weights = torch.arange(out.numel(), dtype=out.dtype).view(out.shape) / out.numel()  # rows weigh differently
    loss = (out.square() * weights).sum() + aux
    grads = torch.autograd.grad(loss, [x, *moe.parameters()])
    return loss.detach(), list(grads)


def test_a_checkpointed_moe_block_compiles_whole_and_equals_eager():
    torch.manual_seed(0)
    moe = MoE(DIM, HIDDEN, EXPERTS, TOP_K)
    with torch.no_grad():
        moe.router.weight.normal_()  # a router that picks unevenly: loads differ between experts

    def eager(h):
        return recomputed(lambda s: block(moe, s), h)

    torch._dynamo.reset()
    # capture_scalar_outputs off (torch's default): a count read on the host would be a graph break
    with torch._dynamo.config.patch(capture_scalar_outputs=False):
        compiled = torch.compile(eager, backend="aot_eager")
        before, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
        for seed in (1, 2):  # a new batch (new loads) runs the same graph: the counts are not shapes
            x = torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(seed))
            loss, grads = loss_and_grads(compiled, moe, x)
            expected_loss, expected_grads = loss_and_grads(eager, moe, x)
            torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
            for got, want in zip(grads, expected_grads, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert sum(counters["graph_break"].values()) == breaks, dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] - before == 1  # 0: the region ran eagerly
    torch._dynamo.reset()
