"""Grouped-query attention under the parallel plans, without processes: the packed qkv layout (whole key/value
groups, so tensor parallelism hands each rank its query heads and the key/value heads they read), its way back to
the plain layout (consolidated checkpoints), and the memory estimate's tensor-parallel step. The gradients of a
sharded GQA step against one process: tests/experiments/test_parallel.py (gloo)."""

from __future__ import annotations

import torch
from torch import nn

from experiments.parallel.memory import MemorySetup, measure, workload_for
from experiments.parallel.packed import PackedLinear, pack_trunk, unpack_state_dict
from models import TrunkConfig
from models.trunk import Trunk

D, HEADS, KV, DH = 32, 4, 2, 8


def test_grouped_packing_holds_whole_key_value_groups_and_computes_the_fused_linear():
    torch.manual_seed(0)
    linear = nn.Linear(D, D + 2 * KV * DH)
    packed = PackedLinear(linear, HEADS // KV + 2, kv_heads=KV)
    assert packed.weight.shape == (KV, 4, DH, D) and packed.bias.shape == (KV, 4, DH) and packed.shard_dim == 0
    w = linear.weight
    for j in range(KV):  # group j: query heads 2j and 2j + 1, key head j, value head j
        rows = [w[(2 * j + i) * DH :][:DH] for i in (0, 1)] + [w[D + j * DH :][:DH], w[D + KV * DH + j * DH :][:DH]]
        assert torch.equal(packed.weight[j], torch.stack(rows))
    x = torch.randn(2, 5, D)
    assert torch.equal(packed(x), linear(x))
    plain = unpack_state_dict({"net.trunk.blocks.0.attn.qkv.weight": packed.weight.detach(),
                               "net.trunk.blocks.0.attn.qkv.bias": packed.bias.detach(),
                               "net.trunk.blocks.0.mlp.fc1.weight": torch.zeros(2, 3, D)})  # fmt: skip
    assert torch.equal(plain["net.trunk.blocks.0.attn.qkv.weight"], w)
    assert torch.equal(plain["net.trunk.blocks.0.attn.qkv.bias"], linear.bias)
    assert plain["net.trunk.blocks.0.mlp.fc1.weight"].shape == (6, D)
    meta = unpack_state_dict({"trunk.blocks.1.attn.qkv.weight": torch.empty(KV, 4, DH, D, device="meta")})
    assert meta["trunk.blocks.1.attn.qkv.weight"].shape == (D + 2 * KV * DH, D)  # a checkpoint's shapes alone


def test_a_packed_gqa_trunk_computes_the_plain_one():
    cfg = TrunkConfig(dim=D, depth=2, num_heads=HEADS, num_kv_heads=KV, qk_norm=True, mlp="swiglu", bias=True)
    torch.manual_seed(0)
    trunk = Trunk(cfg)
    x = torch.randn(2, 6, D)
    plain = trunk(x, is_causal=True)
    state = trunk.state_dict()
    pack_trunk(trunk)
    assert trunk.blocks[0].attn.qkv.weight.shape == (KV, HEADS // KV + 2, DH, D)
    assert torch.equal(trunk(x, is_causal=True), plain)
    back = unpack_state_dict({f"trunk.{k}": v for k, v in trunk.state_dict().items()})  # keys as a network's
    assert all(torch.equal(back[f"trunk.{k}"], v) for k, v in state.items())
    mha = Trunk(TrunkConfig(dim=D, depth=1, num_heads=HEADS))
    pack_trunk(mha)
    assert mha.blocks[0].attn.qkv.weight.shape == (3, D, D)  # multi-head: the layout of every existing checkpoint


def test_the_memory_estimate_runs_a_tensor_parallel_gqa_step():
    """Fake process group of 2, tensor parallel 2: each rank holds 1 of 2 key/value heads (and 2 of 4 query heads);
    the step runs through the real plan, and AdamW's moments on a rank are fewer than on one device (the block's
    projections are split; embeddings and head stay whole at data_parallel 1)."""
    trunk = dict(dim=64, depth=1, num_heads=HEADS, num_kv_heads=KV, mlp="swiglu", mlp_hidden=128,
                 norm_layer="rmsnorm", qk_norm=True, bias=False)  # fmt: skip
    work = workload_for("lm", dict(trunk=trunk, vocab_size=256, max_seq_len=32), batch_size=2)
    est = measure(work, MemorySetup("fsdp2", world_size=2, data_parallel=1, tensor_parallel=2), False)
    assert est.peak > 0 and est.activations > 0
    one = measure(work, MemorySetup("single"), False)
    assert est.optimizer < one.optimizer
