"""Shared by the loaders: strict renaming, strict loading, and refusals that list every problem."""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import Tensor, nn

from models.config import TrunkConfig

Source = nn.Module | Mapping[str, Tensor]


def _split(source: Source) -> tuple[nn.Module | None, dict[str, Tensor]]:
    """``(module or None, a private copy of its state dict)``."""
    if isinstance(source, nn.Module):
        return source, dict(source.state_dict())
    if isinstance(source, Mapping):
        return None, dict(source)
    raise TypeError(f"expected an nn.Module or a state dict, got {type(source).__name__}")


def _refuse(what: str, problems: list[str], supported: str) -> None:
    """Raises one ValueError listing every problem, or returns if there is none."""
    if problems:
        listing = "\n".join(f"  - {p}" for p in dict.fromkeys(problems))  # dedupe, keep order
        raise ValueError(f"cannot load {what}:\n{listing}\nsupported: {supported}")


def _every_block(problems: list[str]) -> list[str]:
    """``blocks.3.ls1 ...`` -> ``blocks.*.ls1 ...``: one line per kind of problem, not per block."""
    return [re.sub(r"blocks\.\d+\b", "blocks.*", p) for p in problems]


def _short(keys: list[str], n: int = 6) -> str:
    return ", ".join(keys[:n]) + (f", ... ({len(keys)} in all)" if len(keys) > n else "")


def _rename(sd: dict[str, Tensor], table: tuple[tuple[str, str], ...]) -> dict[str, Tensor]:
    """Moves every key of ``sd`` that matches a ``(pattern, replacement)`` into the returned dict."""
    out = {}
    for key in list(sd):
        for pattern, repl in table:
            new, hits = re.subn(pattern, repl, key)
            if hits:
                out[new] = sd.pop(key)
                break
    return out


def _explain(leftover: list[str], features: tuple[tuple[str, str], ...]) -> list[str]:
    """Turns unconsumed source keys into problems, naming the feature they belong to when known."""
    problems, rest = [], list(leftover)
    for pattern, feature in features:
        hits = [k for k in rest if re.search(pattern, k)]
        if hits:
            problems.append(f"{feature} (tensors {_short(hits)})")
            rest = [k for k in rest if k not in hits]
    if rest:
        problems.append(f"source tensors with no counterpart in our network: {_short(rest)}")
    return problems


def _load_strict(model: nn.Module, mapped: dict[str, Tensor], problems: list[str], what: str, supported: str) -> None:
    """Every one of ours filled with the right shape, nothing left over; then ``load_state_dict``.

    Known ``problems`` are raised first: the key diff they would cause is noise.
    """
    _refuse(what, problems, supported)
    ours = model.state_dict()
    missing = sorted(set(ours) - set(mapped))
    if missing:
        problems.append(f"our tensors the source does not fill: {_short(missing)}")
    extra = sorted(set(mapped) - set(ours))
    if extra:
        problems.append(f"mapped tensors our network does not have: {_short(extra)}")
    shapes = [
        f"{k}: source {tuple(v.shape)} vs ours {tuple(ours[k].shape)}"
        for k, v in mapped.items()
        if k in ours and v.shape != ours[k].shape
    ]
    if shapes:
        problems.append(f"shape mismatches (a different size or layout): {_short(shapes, 4)}")
    _refuse(what, problems, supported)
    model.load_state_dict(mapped, strict=True)


def _trunk_problems(cfg: TrunkConfig, mlp: tuple[str, ...]) -> list[str]:
    """What a reference block needs from our trunk config, whatever the source."""
    problems = []
    if cfg.norm_scheme != "pre":
        problems.append(
            f"our norm_scheme is {cfg.norm_scheme!r}; only 'pre' computes the reference block "
            "x = x + F(N(x)), other schemes have other norms and no weights to map onto them"
        )
    if cfg.norm_layer != "layernorm":
        problems.append(f"our norm_layer is {cfg.norm_layer!r}; the reference uses layernorm")
    if cfg.moe_experts:
        problems.append(f"our trunk is a mixture of experts ({cfg.moe_experts}); the reference MLP is dense")
    if cfg.qk_norm and cfg.qk_norm_scope != "per_head":
        problems.append(f"our qk_norm_scope is {cfg.qk_norm_scope!r}; the reference normalizes q and k per head")
    if cfg.mlp not in mlp:
        problems.append(f"our mlp is {cfg.mlp!r}; the reference activation gives {' or '.join(mlp)}")
    return problems


def _eps_problems(norms: dict[str, float], cfg: TrunkConfig, mlp: str) -> list[str]:
    """Each source norm against the eps our counterpart uses: names matching ``mlp`` (the MLP
    branch's norm) against ``mlp_norm_eps`` when set, every other against ``norm_eps``."""
    problems = []
    for name, e in norms.items():
        if re.search(mlp, name) and cfg.mlp_norm_eps is not None:
            ours, field = cfg.mlp_norm_eps, "mlp_norm_eps"
        else:
            ours, field = cfg.norm_eps, "norm_eps"
        if e != ours:
            problems.append(f"{name} has eps {e:g}, our trunk uses {field} {ours:g}")
    return problems
