"""A transformers folder exported by the suite -> the suite's ``LanguageModel`` again, e.g. to fine-tune it.

    DIR/config.json                  model_type "suite_lm": trunk, vocab_size, max_seq_len, rope_base,
                                     tie_word_embeddings (written by ``python -m experiments export``)
    DIR/model.safetensors            the weights under ``model.`` (or shards + model.safetensors.index.json)

Only JSON and safetensors are read: nothing in the folder runs (its Python files are not imported), so
this needs neither transformers nor ``trust_remote_code``. Loading into an existing network checks that the
folder's trunk is the network's, up to the settings that only matter in training (dropouts, recomputation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from models.config import TrunkConfig
from models.lm import LanguageModel

MODEL_TYPE = "suite_lm"
PREFIX = "model."
TRAINING_ONLY = ("drop_path", "attn_drop", "activation_checkpointing", "recompute_norms")  # may differ


def read_suite_export(directory: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config, state dict of the LanguageModel)`` of an exported folder.

    Raises:
        ValueError: one line, when the folder is not a suite LM export or its weights are missing.
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        raise ValueError(f"{str(directory)!r} holds no readable config.json; valid: an exported LM folder") from None
    found = config.get("model_type") if isinstance(config, dict) else None
    if found != MODEL_TYPE or not isinstance(config.get("trunk"), dict):
        raise ValueError(f"{str(config_path)!r} is not a suite LM export (model_type {found!r}, not {MODEL_TYPE!r})")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{str(directory)!r} has no model.safetensors; valid: a folder written by export")
    weights: dict[str, Tensor] = {}
    for name in files:
        weights.update(load_file(directory / name))
    state = {k.removeprefix(PREFIX): v for k, v in weights.items() if k.startswith(PREFIX)}
    if config.get("tie_word_embeddings") and "head.weight" not in state:
        state["head.weight"] = state["embed.weight"]  # a tied head is stored once
    return config, state


def trunk_differences(exported: dict[str, Any], ours: TrunkConfig) -> list[str]:
    """Trunk fields whose values differ, training-only settings excepted: ``["dim: 128 vs 256", ...]``."""
    mine = ours.to_dict()
    return [
        f"{k}: {exported.get(k)!r} in the export, {mine[k]!r} here"
        for k in mine
        if k not in TRAINING_ONLY and exported.get(k, mine[k]) != mine[k]
    ]


def load_suite_export(model: LanguageModel, directory: str | Path) -> LanguageModel:
    """Loads an exported folder's weights into ``model``, in place (its window may differ: RoPE is not stored).

    Raises:
        ValueError: one line naming what differs (trunk fields, vocabulary, tying) or what is missing.
    """
    config, state = read_suite_export(directory)
    problems = trunk_differences(config["trunk"], model.cfg)
    if int(config.get("vocab_size", -1)) != model.vocab_size:
        problems.append(f"vocab_size: {config.get('vocab_size')} in the export, {model.vocab_size} here")
    tied = model.head.weight is model.embed.weight
    if bool(config.get("tie_word_embeddings")) != tied:
        problems.append(f"tie_embeddings: {bool(config.get('tie_word_embeddings'))} in the export, {tied} here")
    if float(config.get("rope_base", 10000.0)) != model.rope_base:
        problems.append(f"rope_base: {config.get('rope_base')} in the export, {model.rope_base} here")
    if problems:
        raise ValueError(f"the export {str(directory)!r} does not fit this model: {'; '.join(problems)}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"the export {str(directory)!r} does not fit this model: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    return model


def lm_from_export(directory: str | Path, max_seq_len: int | None = None) -> LanguageModel:
    """A ``LanguageModel`` built from an exported folder's config and loaded with its weights."""
    config, _ = read_suite_export(directory)
    model = LanguageModel(
        TrunkConfig(**config["trunk"]),
        int(config["vocab_size"]),
        max_seq_len=max_seq_len or int(config["max_seq_len"]),
        tie_embeddings=bool(config.get("tie_word_embeddings")),
        rope_base=float(config.get("rope_base", 10000.0)),
    )
    return load_suite_export(model, directory)
