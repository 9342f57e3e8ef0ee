"""Every shipped norm overlay carries its authors' recipe: the trunk ``-c configs/<task>/tiny.yaml -c
configs/norm/<name>.yaml`` resolves to is the task's trunk with exactly the options ``models.presets.RECIPES[name]``
names (and the overlay's scheme), nothing more, nothing less; and each recipe's Pre-Norm baseline exists.

The overlay is merged into the task config's trunk by hand (the parser's merge of a mapping is the same update;
tests/experiments/test_configs.py runs the real parser over every overlay), then built as a ``TrunkConfig``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from models import TrunkConfig
from models.presets import RECIPES
from models.schemes import NormScheme

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = {
    p.stem: yaml.safe_load(p.read_text())["model"]["init_args"]["trunk"] for p in ROOT.glob("configs/norm/*.yaml")
}


def task_trunk(task: str) -> dict:
    return yaml.safe_load((ROOT / f"configs/{task}/tiny.yaml").read_text())["model"]["init_args"]["trunk"]


def test_every_overlay_names_a_recipe_and_every_recipe_an_overlay():
    assert set(OVERLAYS) == set(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_overlay_resolves_to_the_task_trunk_plus_its_recipe(name: str):
    recipe, overlay = RECIPES[name], OVERLAYS[name]
    for task in recipe.tasks:
        base = TrunkConfig(**task_trunk(task)).to_dict()
        resolved = TrunkConfig(**{**task_trunk(task), **overlay}).to_dict()
        expected = {**base, **recipe.trunk}
        if "norm_scheme" in overlay:
            expected["norm_scheme"] = overlay["norm_scheme"]
        assert resolved == expected, (name, task)
    assert set(overlay) - {"norm_scheme"} <= set(recipe.trunk), name  # every option it sets is the recipe's


def test_reordered_runs_olmo2s_full_qk_norm_and_its_baseline_too():
    """The zoo's reordered cell normalizes whole q and k projections (OLMo 2), not per head."""
    for name in ("reordered", "pre-qk-full"):
        trunk = TrunkConfig(**{**task_trunk("lm"), **OVERLAYS[name]})
        assert trunk.qk_norm and trunk.qk_norm_scope == "full", name


def test_dyt_llama_has_no_qk_norm_and_takes_alpha_from_the_width():
    """The DyT paper's LM is the LLaMA port: no QK-norm; alpha by the width rule (width 128: 1.0 / 1.0)."""
    trunk = TrunkConfig(**{**task_trunk("lm"), **OVERLAYS["pre-dyt-llama"]})
    assert not trunk.qk_norm and trunk.dyt_alpha_rule == "width"
    assert [trunk.dyt_init(k).alpha for k in ("attn", "mlp", "readout")] == [1.0, 1.0, 1.0]


def test_every_scheme_has_an_overlay_and_every_recipe_changing_the_trunk_a_pre_norm_baseline():
    """A scheme overlay whose recipe changes a trunk option has a Pre-Norm overlay with the same option, so a table of
    the two isolates the placement."""
    assert {s.value for s in NormScheme} <= set(OVERLAYS)
    for name, recipe in RECIPES.items():
        options = {k: v for k, v in recipe.trunk.items() if k != "norm_scheme"}
        if name in {s.value for s in NormScheme} and options and name != "pre":
            twins = [n for n, r in RECIPES.items() if r.trunk == {"norm_scheme": "pre", **options}]
            assert twins, f"{name}: no Pre-Norm overlay with {options}"


#: What a norm-layer port sets besides the layer (its alphas; the DiT init its port uses, nothing on an LM's trunk).
LAYER_OPTIONS = {"norm_layer", "dyt_alpha_rule", "dyt_alpha_init", "dyt_alpha_init_attn", "dyt_alpha_init_mlp",
                 "dyt_alpha_init_final", "dyt_bias", "adaln_zero_init"}  # fmt: skip


def test_every_norm_layer_port_has_an_rmsnorm_pre_norm_twin_with_the_rest_of_its_trunk():
    """A recipe that swaps the norm layer and changes other trunk options (DyT's LLaMA port: no QK-norm, a learnable
    sqrt(d) embedding scale) has a Pre-Norm overlay with exactly those other options and RMSNorm, so the table reads
    the layer alone against it (pre-no-qk-norm alone would also carry the embedding scale's effect)."""
    assert set(TrunkConfig().to_dict()) >= LAYER_OPTIONS
    ports = {n: r for n, r in RECIPES.items() if "lm" in r.tasks and r.trunk.get("norm_layer", "rmsnorm") != "rmsnorm"}
    assert {"pre-dyt-llama", "pre-derf-gpt2", "pre-dyt-llama-a8", "pre-derf-gpt2-a4"} <= set(ports)
    for name, recipe in ports.items():
        rest = {k: v for k, v in recipe.trunk.items() if k not in LAYER_OPTIONS | {"norm_scheme"}}
        if rest:
            twins = [n for n, r in RECIPES.items() if r.trunk == {"norm_scheme": "pre", **rest}]
            assert twins, f"{name}: no RMSNorm Pre-Norm overlay with {rest}"
