"""Initial values drawn per parameter (models/init_values.py): what makes a shard drawable without the rest.

Each random parameter draws from its own generator seeded by the network seed and its name, so its value
depends on nothing else: not on the draws before it (a deeper network shares its first blocks' values), not
on the constructors (a build with its large tensors on the meta device leaves everything else, and the global
generator, as a full build does). Every parameter outside the plan is a constant of its constructor, for every
scheme, so a rank that builds it for real gets the one-process value.
"""

from __future__ import annotations

import math

import pytest
import torch

from models import DiT, LanguageModel, TrunkConfig, ViTClassifier
from models.init_values import meta_parameters, param_seed
from models.olmo_init import input_std
from models.schemes import SCHEMES

SMALL = dict(dim=16, depth=2, num_heads=2, mlp_hidden=32)


def networks(scheme: str) -> dict[str, torch.nn.Module]:
    """One small network per stem under ``scheme`` (mHC in its paper variant has a random constant ``hc_fn``)."""
    trunk = TrunkConfig(**SMALL, norm_scheme=scheme)
    return {
        "lm": LanguageModel(trunk, 32, 8),
        "vit": ViTClassifier(trunk, img_size=8, patch_size=4, num_classes=5),
        "dit": DiT(TrunkConfig(**SMALL, norm_scheme=scheme, init="xavier"), input_size=4, patch_size=2, num_classes=3),
    }


@pytest.mark.parametrize("scheme", [s.value for s in SCHEMES])
def test_what_the_plan_leaves_out_is_a_constant_and_what_meta_builds_the_plan_covers(scheme: str):
    torch.manual_seed(0)
    first = networks(scheme)
    torch.manual_seed(1)
    second = networks(scheme)
    torch.manual_seed(0)
    with meta_parameters():
        meta = networks(scheme)
    for stem, net in first.items():
        plan = net.init_plan()
        assert first[stem].init_seed != second[stem].init_seed
        other = dict(second[stem].named_parameters())
        built = dict(meta[stem].named_parameters())
        for name, param in net.named_parameters():
            if name in plan:
                continue
            assert torch.equal(param, other[name]), f"{scheme} {stem}: {name} is random but outside the init plan"
            assert not built[name].is_meta, f"{scheme} {stem}: {name} is built on meta with no init plan entry"
            assert torch.equal(param, built[name]), f"{scheme} {stem}: {name}"
        buffers = dict(meta[stem].named_buffers())
        assert all(torch.equal(b, buffers[n]) for n, b in net.named_buffers()), f"{scheme} {stem}: a buffer"


def test_a_meta_build_leaves_the_global_generator_as_a_full_build_does():
    """One draw (the network seed) either way: the training randomness after it does not depend on the build."""
    trunk = TrunkConfig(**SMALL, moe_experts=4, moe_hidden=8)
    torch.manual_seed(3)
    full = LanguageModel(trunk, 32, 8)
    after_full = torch.rand(4)
    torch.manual_seed(3)
    with meta_parameters():
        meta = LanguageModel(trunk, 32, 8)
    assert torch.equal(torch.rand(4), after_full) and meta.init_seed == full.init_seed
    on_meta = {n for n, p in meta.named_parameters() if p.is_meta}
    expected = {"embed.weight", "head.weight", "trunk.blocks.0.mlp.experts.w_in", "trunk.blocks.1.attn.proj.weight"}
    assert expected <= on_meta
    torch.manual_seed(3)
    assert torch.randint(0, 1 << 62, ()).item() == full.init_seed  # the seed is that one draw


def test_each_value_comes_from_its_own_generator_whatever_was_drawn_before():
    """A known answer: OLMo's Mitchell rules from the parameter's own generator; and block 0 of a 3-block network is
    block 0 of a 2-block one (the old sequential draws shifted every later tensor when a layer was added)."""
    cfg = dict(dim=16, num_heads=2, mlp="swiglu", mlp_hidden=32, init="mitchell", scaled_output_init=True)
    two = LanguageModel(TrunkConfig(**cfg, depth=2), 32, 8, init_seed=5)
    three = LanguageModel(TrunkConfig(**cfg, depth=3), 32, 8, init_seed=5)
    for name, param in two.named_parameters():
        if not name.startswith("trunk.blocks.1") and not name.startswith("trunk.readout"):
            assert torch.equal(param, three.get_parameter(name)), name

    def olmo(name: str, shape: tuple[int, int], std: float) -> torch.Tensor:  # +-3 std, by inverse CDF
        generator = torch.Generator().manual_seed(param_seed(5, name))
        bound = math.erf(3 / math.sqrt(2))
        u = torch.empty(shape).uniform_(-bound, bound, generator=generator)
        return (u.erfinv() * (std * math.sqrt(2))).clamp(-3 * std, 3 * std)

    assert torch.equal(two.embed.weight, olmo("embed.weight", (32, 16), input_std(16)))
    fc2 = "trunk.blocks.1.mlp.fc2.weight"  # ff_out of layer 1: 1 / sqrt(2 * 32 * 2)
    assert torch.equal(two.get_parameter(fc2), olmo(fc2, (16, 32), 1 / (2 * 32 * 2) ** 0.5))
