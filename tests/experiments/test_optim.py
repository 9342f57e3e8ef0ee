"""Weight decay by a parameter's role: the same parameters decay in the single-process layout (DDP) and in FSDP2's
packed layout, where the fused qkv / SwiGLU projections are 3-D and their biases 2-D."""

from __future__ import annotations

from torch import nn

from experiments.parallel.packed import pack_trunk
from experiments.tasks.optim import param_groups
from models import LanguageModel, TrunkConfig


def decayed(net: nn.Module) -> set[str]:
    groups = param_groups(net, 0.1)
    ids = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    return {name for name, p in net.named_parameters() if id(p) in ids}


def test_the_packed_layout_decays_the_same_parameters_as_the_plain_one():
    cfg = TrunkConfig(dim=32, depth=2, num_heads=2, mlp_hidden=64, bias=True, norm_scheme="siamese")
    net = LanguageModel(cfg, vocab_size=64, max_seq_len=8)
    plain = decayed(net)
    # by hand: the weight matrices of the Linear layers, nothing else (embedding table, norms, biases: no decay)
    assert plain == {f"{n}.weight" for n, m in net.named_modules() if isinstance(m, nn.Linear)}
    pack_trunk(net.trunk)
    assert net.trunk.blocks[0].attn.qkv.bias.ndim == 2  # FSDP2's layout: the packed bias is a matrix
    assert decayed(net) == plain  # the 2-D packed bias stays out (the shape rule alone decayed it)
