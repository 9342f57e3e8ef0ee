"""Module paths of the flat layout before the package per modality fail with a pointer to the new path."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from datamodules import MOVED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_names_its_new_one(old):
    with pytest.raises(ModuleNotFoundError, match=f"^{old} moved to {MOVED[old]}$"):
        importlib.import_module(old)
    importlib.import_module(MOVED[old])  # and the new one is there


def test_an_old_python_dash_m_command_says_where_it_went():
    done = subprocess.run([sys.executable, "-m", "datamodules.prepare_text", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "datamodules.prepare_text moved to datamodules.text.prepare" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_config_class_path_of_the_old_layout_names_the_new_one(capsys):
    from experiments.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "configs/vit/tiny.yaml", "--data.class_path=datamodules.image_folder.ImageFolderDataModule",
              "--print_config"])  # fmt: skip
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == "error: datamodules.image_folder moved to datamodules.images.folder"
