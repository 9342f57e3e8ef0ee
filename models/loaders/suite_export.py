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

from torch import Tensor

from models.config import TrunkConfig
from models.lm import LanguageModel
from models.loaders.common import MAX_CONFIG_BYTES, read_json_file, read_safetensors

MODEL_TYPE = "suite_lm"
PREFIX = "model."
MAX_WINDOW = 1 << 20  # tokens of context: RoPE tables of a longer window would not fit in memory
TRAINING_ONLY = ("drop_path", "attn_drop", "activation_checkpointing", "recompute_norms")  # may differ


# The auto_map an export writes: the folder's code is the suite's generated modules, nothing else.
AUTO_MAP = {
    "AutoConfig": "configuration_suite_lm.SuiteLMConfig",
    "AutoModelForCausalLM": "modeling_suite_lm.SuiteLMForCausalLM",
}


def read_suite_export(directory: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config, state dict of the LanguageModel)`` of an exported folder.

    Refused in one line: a missing or unreadable ``config.json`` (too large, not JSON, nested too deeply), one of
    another model type or naming other code in ``auto_map``, a weights file that is missing, cut short or not
    safetensors (:func:`models.loaders.common.read_safetensors`), an index naming files outside the folder.

    Raises:
        ValueError: one line naming the file and what is wrong with it.
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    if not directory.is_dir():
        raise ValueError(
            f"{str(directory)!r} is not a directory; valid: a folder written by python -m experiments export"
        )
    config = read_json_file(config_path, "the export's config.json", MAX_CONFIG_BYTES)
    found = config.get("model_type")
    if found != MODEL_TYPE or not isinstance(config.get("trunk"), dict):
        raise ValueError(f"{str(config_path)!r} is not a suite LM export (model_type {found!r}, not {MODEL_TYPE!r})")
    auto_map = config.get("auto_map", AUTO_MAP)
    if auto_map != AUTO_MAP:
        raise ValueError(
            f"{str(config_path)!r} names other code in auto_map ({json.dumps(auto_map)[:160]}); valid: an export's own "
            f"{json.dumps(AUTO_MAP)}"
        )
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_file(index, "the export's weight index", MAX_CONFIG_BYTES).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{str(index)!r} holds no weight_map of file names; valid: an index written by export")
        files = sorted(set(weight_map.values()))
        outside = [f for f in files if Path(f).name != f or not f.endswith(".safetensors")]
        if outside:
            raise ValueError(f"{str(index)!r} names {outside[0]!r}; valid: .safetensors files inside the folder")
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{str(directory)!r} has no model.safetensors; valid: a folder written by export")
    weights: dict[str, Tensor] = {}
    for name in files:
        weights.update(read_safetensors(directory / name))
    state = {k.removeprefix(PREFIX): v for k, v in weights.items() if k.startswith(PREFIX)}
    if config.get("tie_word_embeddings") and "head.weight" not in state and "embed.weight" in state:
        state["head.weight"] = state["embed.weight"]  # a tied head is stored once
    return config, state


def trunk_differences(exported: dict[str, Any], ours: TrunkConfig) -> list[str]:
    """Trunk fields whose values differ, training-only settings excepted: ``["dim: 128 vs 256", ...]``.
    ``num_kv_heads`` null and equal to ``num_heads`` are the same network (an export older than the field: null)."""
    mine = ours.to_dict()
    exported = dict(exported)
    kv_heads = exported.get("num_kv_heads") or exported.get("num_heads", ours.num_heads)
    exported["num_kv_heads"] = mine["num_kv_heads"] if kv_heads == ours.kv_heads else kv_heads
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
    vocab_size = config.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise ValueError(
            f"{str(Path(directory) / 'config.json')!r}: vocab_size is {vocab_size!r}, not a whole number; valid: the "
            "config.json export wrote"
        )
    if vocab_size != model.vocab_size:
        problems.append(f"vocab_size: {config.get('vocab_size')} in the export, {model.vocab_size} here")
    tied = model.head.weight is model.embed.weight
    if bool(config.get("tie_word_embeddings")) != tied:
        problems.append(f"tie_embeddings: {bool(config.get('tie_word_embeddings'))} in the export, {tied} here")
    if float(config.get("rope_base", 10000.0)) != model.rope_base:
        problems.append(f"rope_base: {config.get('rope_base')} in the export, {model.rope_base} here")
    if problems:
        raise ValueError(f"the export {str(directory)!r} does not fit this model: {'; '.join(problems)}")
    mismatched = [
        f"{k}: {tuple(v.shape)} in the export, {tuple(model.state_dict()[k].shape)} here"
        for k, v in state.items()
        if k in model.state_dict() and tuple(v.shape) != tuple(model.state_dict()[k].shape)
    ]
    if mismatched:  # swapped or edited weights: named here, not as load_state_dict's multi-line report
        raise ValueError(f"the export {str(directory)!r} does not fit this model: {mismatched[0]}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"the export {str(directory)!r} does not fit this model: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    return model


def lm_from_export(directory: str | Path, max_seq_len: int | None = None) -> LanguageModel:
    """A ``LanguageModel`` built from an exported folder's config and loaded with its weights."""
    config, state = read_suite_export(directory)
    try:
        trunk = TrunkConfig(**config["trunk"])
        sizes = (
            int(config["vocab_size"]),
            max_seq_len or int(config["max_seq_len"]),
            float(config.get("rope_base", 1e4)),
        )
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(
            f"{str(Path(directory) / 'config.json')!r} does not describe a suite LM "
            f"({str(err).splitlines()[0][:160]}); "
            "valid: the config.json export wrote"
        ) from None
    if not 1 <= sizes[1] <= MAX_WINDOW:
        raise ValueError(
            f"{str(Path(directory) / 'config.json')!r}: max_seq_len {sizes[1]}; valid: 1 to {MAX_WINDOW} "
            "(or pass max_seq_len)"
        )
    embed = state.get("embed.weight")
    if embed is None or tuple(embed.shape) != (sizes[0], trunk.dim):  # before building: an edited size allocates
        found = tuple(embed.shape) if embed is not None else "missing"
        raise ValueError(
            f"the export {str(directory)!r}: its weights' embed.weight is {found} but config.json says vocab_size "
            f"{sizes[0]}, dim {trunk.dim}; valid: the config.json and weights export wrote together"
        )
    tied = bool(config.get("tie_word_embeddings"))
    model = LanguageModel(trunk, sizes[0], max_seq_len=sizes[1], tie_embeddings=tied, rope_base=sizes[2])
    return load_suite_export(model, directory)
