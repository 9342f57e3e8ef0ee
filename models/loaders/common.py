"""Shared by the loaders: strict renaming, strict loading, refusals that list every problem, and the checked
reads of a folder's files (JSON within a size, safetensors whose header fits the file), each a one-line
ValueError naming the file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from fileio.checks import read_json
from models.config import TrunkConfig

Source = nn.Module | Mapping[str, Tensor]

MAX_CONFIG_BYTES = 16 << 20  # a config.json or weight index of any real model is kilobytes
MAX_SAFETENSORS_HEADER = 100 << 20  # the safetensors library's own limit on the JSON header


def read_json_file(path: Path, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A folder's JSON file as an object; one-line ValueError (too large, not JSON, too deep, not an object)."""
    return read_json(path, what, expect=dict, max_bytes=max_bytes)


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """The tensors of a ``.safetensors`` file a user handed in, or one line saying why it is not one.

    The 8-byte header length is checked against the file before the library reads it (a corrupted length
    makes it fail with its own error type, or try to allocate the claimed size); any error it still raises
    becomes a ValueError naming the file.
    """
    path = Path(path)
    valid = "valid: a .safetensors file written by the suite's export (export again to repair it)"
    if not path.is_file():
        raise ValueError(f"{str(path)!r} is missing; {valid}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    claimed = int.from_bytes(head, "little") if len(head) == 8 else -1
    if claimed < 2 or claimed > min(size - 8, MAX_SAFETENSORS_HEADER):
        what = f"a header of {claimed:,} bytes" if claimed >= 0 else "no header"
        raise ValueError(f"{str(path)!r} is not a safetensors file ({size:,} bytes claiming {what}); {valid}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ValueError(f"{str(path)!r} is not a readable safetensors file ({reason}); {valid}") from None


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
    if cfg.kv_heads != cfg.num_heads:
        problems.append(
            f"our num_kv_heads is {cfg.num_kv_heads} of {cfg.num_heads} heads; the reference has one key/value "
            "head per query head"
        )
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
