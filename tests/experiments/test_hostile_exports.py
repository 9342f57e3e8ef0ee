"""Issue #36, exported folders handed back: a transformers folder with a corrupted, cut or missing weights file,
an edited config.json, swapped weights or foreign ``auto_map`` code is refused by the suite's own loader in one
line; through ``fit --model.init_args.init_from`` before any run directory is made (exit 2, nothing changed)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from experiments.__main__ import main
from experiments.sharing import hf
from experiments.sharing.checkpoint import read_run_checkpoint
from experiments.sharing.report import ExportOptions
from models.loaders import lm_from_export
from tests.experiments.sharing.conftest import TEXT_DATA, lm_module, save_run
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """An LM run (pre, 32 wide, 2 blocks, bytes) exported without the reload check."""
    root = tmp_path_factory.mktemp("exported")
    run = read_run_checkpoint(
        save_run(root, "pre", lm_module("pre", 0), "experiments.tasks.LanguageModeling", TEXT_DATA)
    )
    folder = root / "export"
    folder.mkdir()
    hf.export(run, folder, root / "scratch", ExportOptions(check=False))
    return folder


def spoil(export: Path, target: Path, how: str) -> Path:
    """A copy of the export, damaged one way."""
    folder = target / how
    shutil.copytree(export, folder)
    weights, config = folder / "model.safetensors", folder / "config.json"
    if how == "header-too-large":
        data = bytearray(weights.read_bytes())
        data[:8] = (2**40).to_bytes(8, "little")  # what the file held: a length past any file
        weights.write_bytes(bytes(data))
    elif how == "cut-short":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "not-safetensors":
        weights.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + b"\x00" * 64)
    elif how == "missing-weights":
        weights.unlink()
    elif how == "foreign-auto-map":
        data = json.loads(config.read_text())
        data["auto_map"]["AutoModelForCausalLM"] = "evil.Model"
        config.write_text(json.dumps(data))
    elif how == "huge-config":
        config.write_text('{"model_type": "suite_lm", "pad": "' + "x" * (17 << 20) + '"}')
    elif how == "index-outside":
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": {"a": "../../secret.safetensors"}})
        )
    return folder


SPOILED = {
    "header-too-large": "is not a safetensors file",
    "cut-short": "is not a readable safetensors file",
    "not-safetensors": "is not a readable safetensors file",
    "missing-weights": "has no model.safetensors",
    "foreign-auto-map": "names other code in auto_map",
    "huge-config": "valid: a JSON file of at most",
    "index-outside": "names '../../secret.safetensors'; valid: .safetensors files inside the folder",
}


@pytest.mark.parametrize("how", sorted(SPOILED))
def test_fit_init_from_a_spoiled_export_is_one_line_before_any_run(how, export, tmp_path, corpus, capsys):
    text, shards = corpus
    folder = spoil(export, tmp_path / "spoiled", how)
    before = digest(tmp_path)
    args = ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--data.init_args.source={text}",
            f"--data.init_args.data_dir={shards}", *tiny_lm(depth=2), f"--runs_root={tmp_path / 'runs'}",
            f"--model.init_args.init_from={folder}", "--trainer.max_steps=1"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: model.init_args.init_from={folder} (command line): "), line
    assert SPOILED[how] in line, line
    assert not (tmp_path / "runs").exists() and digest(tmp_path) == before  # nothing made, nothing changed


def test_an_edited_config_or_swapped_weights_are_named_not_loaded(export, tmp_path):
    edited = spoil(export, tmp_path, "edited-config")
    config = json.loads((edited / "config.json").read_text())
    config["trunk"]["dim"] = 2**40  # would allocate terabytes if built before the weights were compared
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"embed.weight is \(256, 32\) but config.json says vocab_size 256, dim 1099"):
        lm_from_export(edited)
    swapped = spoil(export, tmp_path, "swapped")
    weights = load_file(swapped / "model.safetensors")
    weights["model.trunk.blocks.0.attn.qkv.weight"] = torch.zeros(7, 32)  # another model's tensor under this name
    save_file(weights, swapped / "model.safetensors")
    with pytest.raises(ValueError, match=r"does not fit this model: trunk.blocks.0.attn.qkv.weight: \(7, 32\) in the"):
        lm_from_export(swapped)
