"""``TrunkConfig`` refuses every out-of-range number at construction, in one line that names the field.

The bad values below are written out independently of ``models.config.BOUNDS``, and every numeric field
of the dataclass must appear here, so a new bounded field without a check (or a check that is too loose
or too strict) fails.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from models import TrunkConfig
from models.config import BOUNDS

# field -> (values that must be refused, values at or near the edges that must be accepted)
CASES: dict[str, tuple[list, list]] = {
    "dim": ([0, -4, 2.5, "64", True], [4, 1024]),
    "depth": ([0, -1, 1.0, None], [1, 80]),
    "num_heads": ([0, -2, 2.0], [1, 4]),
    "num_kv_heads": ([0, -1, 1.5, True, "2"], [None, 1, 2]),
    "mlp_hidden": ([0, -8, 16.5], [None, 1, 24]),
    "norm_eps": ([0, 0.0, -1e-6, math.nan, math.inf, "1e-5", None], [1e-12, 1e-5, 1]),
    "mlp_norm_eps": ([0.0, -1e-5, math.nan], [None, 1e-6]),
    "drop_path": ([-0.1, 1.0, 1.5, math.nan], [0.0, 0.999]),
    "attn_drop": ([-0.01, 1.0, 2, math.nan, "0.1"], [0.0, 0.5]),
    "moe_experts": ([-1, 1.5], [0, 64]),
    "moe_top_k": ([0, -1, 1.5], [1, 2]),
    "moe_hidden": ([0, -1, 8.0], [None, 1, 256]),
    "mix_ratio": ([-0.25, 1.01, math.nan], [0.0, 0.25, 1.0]),
    "init_std": ([0.0, -0.02, math.inf], [1e-4, 0.02]),
    "mhc_streams": ([0, -1, 2.5, True], [1, 4]),
    "attn_res_block_size": ([0, -2, 1.5, True], [1, 2, 8]),
    "dyt_alpha_init": ([0.0, -0.5, math.nan, None, "0.5"], [1e-3, 0.5, 2.0]),
    "dyt_alpha_init_attn": ([0.0, -0.8, math.inf], [None, 0.8]),
    "dyt_alpha_init_mlp": ([0.0, -0.2, math.nan], [None, 0.2]),
    "dyt_alpha_init_final": ([0, -1.0, "0.2"], [None, 0.2]),
}
BASE = dict(dim=16, depth=2, num_heads=2)


def numeric_fields() -> set[str]:
    return {f.name for f in fields(TrunkConfig) if any(t in str(f.type) for t in ("int", "float"))}


def test_every_numeric_field_is_bounded_and_tested():
    assert numeric_fields() == set(BOUNDS) == set(CASES)


@pytest.mark.parametrize(
    ("name", "value"), [(name, v) for name, (bad, _) in CASES.items() for v in bad], ids=lambda x: repr(x)
)
def test_out_of_range_value_is_refused_naming_the_field(name, value):
    kwargs = {**BASE, name: value}
    if name == "num_heads":
        kwargs["dim"] = 16
    with pytest.raises(ValueError) as err:
        TrunkConfig(**kwargs)
    message = str(err.value)
    assert f"trunk {name} must be" in message and repr(value) in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("name", "value"), [(name, v) for name, (_, good) in CASES.items() for v in good], ids=lambda x: repr(x)
)
def test_in_range_value_is_accepted(name, value):
    kwargs = {**BASE, name: value}
    if name == "dim":
        kwargs["num_heads"] = 4 if value % 4 == 0 else 1
    if name == "num_heads":
        kwargs["dim"] = 16
    if name == "moe_top_k" or (name == "moe_experts" and value):
        kwargs.update(moe_experts=64, mlp="swiglu")
    assert getattr(TrunkConfig(**kwargs), name) == value


def test_moe_top_k_cannot_exceed_the_experts():
    with pytest.raises(ValueError, match=r"trunk moe_top_k 5 must be in \[1, moe_experts=4\]"):
        TrunkConfig(**BASE, moe_experts=4, moe_top_k=5)
    assert TrunkConfig(**BASE, moe_top_k=5).moe_top_k == 5  # unused by a dense trunk


@pytest.mark.parametrize("value", ["yes", 1, None, "on"])
def test_recompute_norms_takes_true_false_or_auto(value):
    with pytest.raises(ValueError, match=f"trunk recompute_norms must be true, false or 'auto', got {value!r}"):
        TrunkConfig(**BASE, recompute_norms=value)
    for ok in (True, False, "auto"):
        assert TrunkConfig(**BASE, recompute_norms=ok).recompute_norms == ok


@pytest.mark.parametrize(
    "name",
    ["qk_norm", "bias", "activation_checkpointing", "siamese_input_norm", "dyt_bias", "learned_embed_scale"],
)  # fmt: skip
def test_switches_must_be_booleans(name):
    with pytest.raises(ValueError, match=f"trunk {name} must be true or false, got 'false'"):
        TrunkConfig(**BASE, **{name: "false"})


@pytest.mark.parametrize("value", ["heads", "FULL", True, None])
def test_qk_norm_scope_is_per_head_or_full(value):
    with pytest.raises(ValueError, match=f"unknown qk_norm_scope {value!r}; valid: per_head, full$"):
        TrunkConfig(**BASE, qk_norm_scope=value)
    assert TrunkConfig(**BASE, qk_norm=True).qk_norm_scope == "per_head"  # `qk_norm: true` means per head


def test_a_yaml_value_reaches_the_check_through_the_cli(tmp_path, capsys):
    """What a user writes in a config is refused with the field's name (not accepted, not a traceback)."""
    from pathlib import Path

    from experiments.cli import SuiteCLI

    root = Path(__file__).resolve().parents[2]
    args = ["-c", str(root / "configs/lm/tiny.yaml"), "--model.init_args.trunk.norm_eps=0", f"--runs_root={tmp_path}"]
    with pytest.raises((ValueError, SystemExit)) as err:
        SuiteCLI(args=args, run=False)
    said = str(err.value) + capsys.readouterr().err  # jsonargparse raises, or exits after printing to stderr
    assert "trunk norm_eps must be a number > 0, got 0.0" in said, said
