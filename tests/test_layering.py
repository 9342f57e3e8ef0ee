"""The package layering the README promises: models/ is plain PyTorch, data never depends on the tasks.

    models/       torch, and diffusers for the VAE -- never lightning, experiments or datamodules
    datamodules/  lightning, torchvision, models -- never experiments

Checked on the source (every import statement, including ones inside functions), so a lazy import
cannot slip through, and by importing the packages in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "models": {"lightning", "pytorch_lightning", "experiments", "datamodules"},
    "datamodules": {"experiments"},
}


def imported_roots(path: Path) -> set[str]:
    """Top-level package names of every absolute import in a file."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_in_their_layer(package):
    violations = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in sorted(imported_roots(path) & FORBIDDEN[package])
    ]
    assert not violations, "; ".join(violations)


def test_importing_models_loads_no_lightning():
    code = (
        "import sys, pkgutil, importlib, models\n"
        "for m in pkgutil.walk_packages(models.__path__, 'models.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('lightning', 'pytorch_lightning'))\n"
        "assert not bad, bad[:5]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1:]


def test_the_checker_sees_lazy_imports(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from experiments.vae import x\n    import lightning.pytorch as L\n")
    assert imported_roots(source) == {"experiments", "lightning"}
