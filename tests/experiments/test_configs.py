"""Every shipped YAML parses; every task config x every norm overlay composes; big presets match the paper."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import yaml

from experiments.cli import SuiteCLI
from models import TrunkConfig, count_params
from models.dit import DiT
from models.lm import LanguageModel
from models.presets import RECIPES
from models.schemes import NormScheme
from models.vit import ViTClassifier

ROOT = Path(__file__).resolve().parents[2]
TASK_CONFIGS = sorted(
    str(p.relative_to(ROOT)) for p in ROOT.glob("configs/*/*.yaml") if p.parent.name in ("lm", "vit", "dit")
)
# Overlays stack on a base config: the MoE switch and the tiny depth family sit on the tiny LM.
OVERLAYS = {
    "configs/lm/moe-tiny.yaml": "configs/lm/tiny.yaml",
    "configs/lm/gqa-tiny.yaml": "configs/lm/tiny.yaml",
    "configs/lm/downstream.yaml": "configs/lm/tiny.yaml",
    # DiT: the FID-50K protocol on the paper model, the synthetic smoke source on the tiny one.
    "configs/dit/eval-fid50k.yaml": "configs/dit/dit-b2.yaml",
    "configs/dit/eval-fid50k-cfg1.5.yaml": "configs/dit/eval-fid50k.yaml",
    "configs/dit/synthetic-latents.yaml": "configs/dit/tiny.yaml",
    **{str(p.relative_to(ROOT)): "configs/lm/tiny.yaml" for p in ROOT.glob("configs/lm/tiny-depth-*.yaml")},
}
NORM_OVERLAYS = {
    p.stem: yaml.safe_load(p.read_text())["model"]["init_args"]["trunk"] for p in ROOT.glob("configs/norm/*.yaml")
}
SCHEMES = {s.value for s in NormScheme}
# Norm-layer overlays set no scheme: they stack after a scheme overlay. The ports of DyT fit one task each.
LAYER_OVERLAYS = {"dyt": ("lm", "vit", "dit"), "dyt-llama": ("lm",), "dyt-llama-a8": ("lm",),
                  "dyt-llama-a16": ("lm",), "dyt-dit": ("dit",), "derf": ("lm", "vit", "dit"), "derf-gpt2": ("lm",),
                  "derf-gpt2-a4": ("lm",), "derf-gpt2-a8": ("lm",)}  # fmt: skip
# Named variants of a scheme (Table 3 ablation rows; sweep cells of a scheme with a norm-layer overlay):
# configs/norm/<scheme>-<variant>.yaml.
VARIANTS = sorted(stem for stem in NORM_OVERLAYS if stem not in SCHEMES and stem not in LAYER_OVERLAYS)
# What a scheme overlay sets besides the scheme: its authors' recipe (models.presets.RECIPES, which
# tests/models/test_recipes.py checks each overlay against), e.g. LayerNorm Scaling's plain init, OLMo 2's QK-norm.
SCHEME_EXTRAS = {name: RECIPES[name].trunk for name in SCHEMES if RECIPES[name].trunk}
TASK_OF = {"lm": "configs/lm/", "vit": "configs/vit/", "dit": "configs/dit/"}


class ParseOnlyCLI(SuiteCLI):
    """Parses and links like the real CLI but instantiates nothing (big configs would allocate GBs)."""

    def instantiate_classes(self) -> None:
        pass


@functools.cache  # a config stack is parsed once (read-only here): each base config recurs once per scheme
def parse(*configs: str, extra: tuple[str, ...] = ()):
    args = []
    for cfg in configs:
        args += ["-c", str(ROOT / cfg)]
    return ParseOnlyCLI(args=[*args, *extra], run=False).config


def configs_for(path: str) -> tuple[str, ...]:
    return (*configs_for(OVERLAYS[path]), path) if path in OVERLAYS else (path,)


# Every norm overlay goes through the real parser on one config per task; on the other task configs of that task
# it is the same YAML merged into the same trunk dataclass, so there the test merges it by hand (checked against
# the parser on the representative) and validates the result with TrunkConfig: a parse costs a good fraction of
# a second, and the (config x overlay) grid is several hundred cases.
REPRESENTATIVE = {"lm": "configs/lm/tiny.yaml", "vit": "configs/vit/tiny.yaml", "dit": "configs/dit/tiny.yaml"}


def base_trunk(task_config: str) -> dict:
    return dict(parse(*configs_for(task_config)).model.init_args.trunk)


def overlaid_trunk(task_config: str, *overlays: str) -> TrunkConfig:
    """The trunk of ``-c <task config> -c configs/norm/<overlay>.yaml ...``: by the parser on the task's
    representative config (which must agree with the merge), by the merge elsewhere."""
    merged = base_trunk(task_config)
    for overlay in overlays:
        merged.update(NORM_OVERLAYS[overlay])
    trunk = TrunkConfig(**merged)  # validates the combination, as the model's constructor would
    if task_config in REPRESENTATIVE.values():
        config = parse(*configs_for(task_config), *(f"configs/norm/{o}.yaml" for o in overlays))
        assert TrunkConfig(**config.model.init_args.trunk) == trunk, f"{task_config} + {overlays}: not the merge"
    return trunk


def test_every_yaml_is_valid_yaml():
    for path in ROOT.glob("configs/**/*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("scheme", [s.value for s in NormScheme])
@pytest.mark.parametrize("task_config", TASK_CONFIGS)
def test_task_config_with_norm_overlay_parses(task_config: str, scheme: str):
    trunk = overlaid_trunk(task_config, scheme)
    assert trunk.norm_scheme == scheme
    # The overlay changed the scheme and nothing else of the trunk (but what SCHEME_EXTRAS names).
    base = TrunkConfig(**base_trunk(task_config))
    assert {**base.to_dict(), "norm_scheme": scheme, **SCHEME_EXTRAS.get(scheme, {})} == trunk.to_dict()


def _network(config):
    init = config.model.init_args
    trunk = TrunkConfig(**init.trunk)
    task = config.model.class_path.rsplit(".", 1)[-1]
    with torch.device("meta"):
        if task == "LanguageModeling":  # what the DataModule would link: 256 bytes or the BPE vocabulary
            data = config.data.init_args
            vocab = 256 if data.tokenizer == "byte" else data.bpe_vocab_size
            return LanguageModel(trunk, vocab, data.seq_len)
        if task == "ImageClassification":
            return ViTClassifier(trunk, 224, init.patch_size, 3, 1000)
        return DiT(trunk, 32, init.patch_size, 4, 1000, learn_sigma=init.learn_sigma)


@pytest.mark.parametrize(
    "path, low, high",
    [
        ("configs/lm/olmo-1b.yaml", 1.2e9, 1.35e9),
        ("configs/lm/depth-d10.yaml", 380e6, 395e6),
        ("configs/lm/depth-d17.yaml", 380e6, 395e6),
        ("configs/lm/depth-d33.yaml", 380e6, 395e6),
        ("configs/lm/depth-d80.yaml", 380e6, 395e6),
        ("configs/lm/moe-15a2b.yaml", 14e9, 16e9),
        ("configs/vit/deit-tiny.yaml", 5.6e6, 5.8e6),
        ("configs/vit/deit-small.yaml", 21.5e6, 22.5e6),
        ("configs/dit/dit-b2.yaml", 129e6, 132e6),
        ("configs/dit/dit-l4.yaml", 455e6, 461e6),
    ],
)
def test_paper_configs_build_paper_sizes(path: str, low: float, high: float):
    n = count_params(_network(parse(path)))
    assert low <= n <= high, f"{path}: {n:,} parameters"


def test_norm_overlays_cover_every_scheme():
    stems = set(NORM_OVERLAYS)
    assert stems >= SCHEMES
    assert all("norm_scheme" not in NORM_OVERLAYS[stem] for stem in LAYER_OVERLAYS)  # they stack on a scheme
    for variant in VARIANTS:  # anything else is a named variant: <scheme>-<variant>, setting its scheme
        assert "-" in variant and NORM_OVERLAYS[variant]["norm_scheme"] == variant.split("-", 1)[0], variant


def layer_overlay_cases() -> list[tuple[str, str]]:
    return [(o, c) for o, tasks in LAYER_OVERLAYS.items() for c in TASK_CONFIGS if any(TASK_OF[t] in c for t in tasks)]


@pytest.mark.parametrize(("overlay", "task_config"), layer_overlay_cases())
def test_norm_layer_overlays_stack_after_a_scheme_and_change_the_norm_layer_only(overlay: str, task_config: str):
    """``-c <task> -c configs/norm/siamese.yaml -c configs/norm/<overlay>.yaml``: the scheme stays, the norm layer
    and its own options change, and the network builds (the port options are refused by the other tasks)."""
    trunk = overlaid_trunk(task_config, "siamese", overlay)
    base = overlaid_trunk(task_config, "siamese")
    changed = {k for k, v in trunk.to_dict().items() if base.to_dict()[k] != v}
    assert trunk.norm_scheme == "siamese" and trunk.norm_layer == NORM_OVERLAYS[overlay]["norm_layer"]
    port = {"norm_layer", "learned_embed_scale", "adaln_zero_init", "qk_norm"}  # what the ports' recipes set
    assert changed <= port | {k for k in changed if "dyt" in k}
    if task_config in REPRESENTATIVE.values():  # the paper-size networks with DyT: tests/models/test_presets.py
        config = parse(*configs_for(task_config), "configs/norm/siamese.yaml", f"configs/norm/{overlay}.yaml")
        assert count_params(_network(config)) > 0


def test_dyt_llama_overlay_holds_the_ports_values():
    """other_tasks/LLaMA: alpha by the paper's width rule (its README's 7B values are the rule at width 4096);
    LayerNormParameterized has no shift; ``shared_scale`` starts at sqrt(emb_dim); no QK-norm. The DiT port:
    adaLN-Zero's zeroing removed."""
    llama = dict(norm_layer="dyt", dyt_alpha_rule="width", qk_norm=False)
    assert NORM_OVERLAYS["dyt-llama"] == {**llama, "dyt_bias": False, "learned_embed_scale": True}
    assert NORM_OVERLAYS["dyt-dit"] == dict(norm_layer="dyt", adaln_zero_init=False)
    assert NORM_OVERLAYS["dyt"] == dict(norm_layer="dyt")


def test_the_tiny_lm_tuned_overlays_are_the_ports_with_one_alpha_changed():
    """dyt-llama-a8 / derf-gpt2-a4 are the LLaMA / GPT-2 ports with every alpha fixed at the value the tiny LM's alpha
    sweeps found (docs/schemes.md), and nothing else changed."""
    llama = {k: v for k, v in NORM_OVERLAYS["dyt-llama"].items() if k != "dyt_alpha_rule"}
    assert NORM_OVERLAYS["dyt-llama-a8"] == {**llama, "dyt_alpha_init": 8.0}
    assert NORM_OVERLAYS["derf-gpt2-a4"] == {**NORM_OVERLAYS["derf-gpt2"], "dyt_alpha_init": 4.0}
    assert NORM_OVERLAYS["dyt-llama-a16"] == {**llama, "dyt_alpha_init": 16.0}
    assert NORM_OVERLAYS["derf-gpt2-a8"] == {**NORM_OVERLAYS["derf-gpt2"], "dyt_alpha_init": 8.0}
    trunk = overlaid_trunk("configs/lm/tiny.yaml", "pre", "dyt-llama-a8")
    assert trunk.dyt_alpha_rule == "fixed"
    assert [trunk.dyt_init(k).alpha for k in ("attn", "mlp", "readout", "qk")] == [8.0] * 4


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.split("-", 1)[1] in LAYER_OVERLAYS])
def test_a_scheme_with_a_layer_overlay_is_the_two_overlays_stacked(variant: str):
    """A sweep cell names one overlay; ``pre-dyt-llama.yaml`` must be ``pre.yaml`` then ``dyt-llama.yaml``."""
    scheme, layer = variant.split("-", 1)
    assert NORM_OVERLAYS[variant] == {**NORM_OVERLAYS[scheme], **NORM_OVERLAYS[layer]}


def variant_cases() -> list[tuple[str, str]]:
    """Every variant with every task config it fits (a variant carrying a port's recipe: that port's task)."""
    tasks = {v: RECIPES[v].tasks for v in VARIANTS}  # the recipe's tasks (a port's: its one task)
    return [(v, c) for v in VARIANTS for c in TASK_CONFIGS if any(TASK_OF[t] in c for t in tasks[v])]


@pytest.mark.parametrize(("variant", "task_config"), variant_cases())
def test_variant_overlays_set_their_scheme_and_switches_only(variant: str, task_config: str):
    scheme, rest = variant.split("-", 1)
    trunk = overlaid_trunk(task_config, variant)
    base = TrunkConfig(**base_trunk(task_config)).to_dict()
    changed = {k for k, v in trunk.to_dict().items() if base[k] != v}
    assert trunk.norm_scheme == scheme
    assert changed - {"norm_scheme"}, f"{variant} changes nothing beyond the scheme"
    switches = {"norm_scheme", "siamese_input_norm", "siamese_depth_scaling", "hybrid_depth_scaling"}
    switches |= set(RECIPES[variant].trunk)  # the options its recipe names (e.g. pre-qk-full's QK-norm)
    if rest in LAYER_OVERLAYS:  # the scheme with a norm-layer overlay: its keys
        switches |= set(NORM_OVERLAYS[rest])
    assert changed <= switches


@pytest.mark.parametrize("shape", sorted(p.stem for p in ROOT.glob("configs/lm/tiny-depth-*.yaml")))
def test_tiny_depth_family_keeps_the_parameter_count(shape: str):
    """Four depth/width shapes at about the tiny LM's parameter count (within 5 %)."""
    tiny = count_params(_network(parse("configs/lm/tiny.yaml")))
    n = count_params(_network(parse("configs/lm/tiny.yaml", f"configs/lm/{shape}.yaml")))
    assert abs(n / tiny - 1) < 0.05, f"{shape}: {n:,} vs tiny {tiny:,}"


@pytest.mark.parametrize("overlay", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("configs/trainer/*.yaml")))
def test_trainer_overlays_stack_on_a_task_config(overlay: str):
    config = parse("configs/lm/tiny.yaml", overlay)
    assert config.trainer.precision is not None


def test_vae_config_parses():
    config = parse("configs/vae/tiny.yaml")
    assert config.model.class_path.endswith("AutoencoderTraining")
