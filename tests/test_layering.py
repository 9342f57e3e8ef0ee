"""The package layering the README promises: models/ is plain PyTorch, data never depends on the tasks, and
inside experiments/ each concern imports only the ones below it.

    models/                    torch, and diffusers for the VAE -- never lightning, experiments or datamodules
    datamodules/               lightning, torchvision, models -- never experiments
    experiments/reliability/   errors, checkpoints, run layout -- no other part of experiments
    experiments/monitoring/    callbacks -- reliability only
    experiments/evaluation/    metrics -- monitoring, reliability (a task calls evaluation, never the reverse)
    experiments/tasks/         LightningModules -- evaluation, monitoring, reliability; never sweeps, tools, cli
    experiments/sweeps/        grids and comparison -- never the tasks (runs are processes), tools or cli
    experiments/analysis/, bench/   tools -- never each other, never sweeps
    experiments/sharing/       export -- tasks, evaluation, monitoring, reliability; never sweeps, other tools, cli

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
    "experiments/reliability": {
        f"experiments.{p}" for p in ("tasks", "monitoring", "evaluation", "sweeps", "analysis", "bench", "cli")
    },
    "experiments/monitoring": {
        f"experiments.{p}" for p in ("tasks", "evaluation", "sweeps", "analysis", "bench", "cli")
    },
    "experiments/evaluation": {f"experiments.{p}" for p in ("tasks", "sweeps", "analysis", "bench", "cli")},
    "experiments/tasks": {f"experiments.{p}" for p in ("sweeps", "analysis", "bench", "cli")},
    "experiments/sweeps": {f"experiments.{p}" for p in ("tasks", "analysis", "bench", "cli")},
    "experiments/analysis": {f"experiments.{p}" for p in ("sweeps", "bench")},
    "experiments/bench": {f"experiments.{p}" for p in ("sweeps", "analysis", "cli")},
    "experiments/sharing": {f"experiments.{p}" for p in ("sweeps", "analysis", "bench", "cli")},
}


def imported_roots(path: Path) -> set[str]:
    """Every absolute import of a file, as its top-level package and, inside experiments, also its
    concern (``experiments.tasks``); ``from experiments import sweeps`` counts as ``experiments.sweeps``."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "experiments":
                names += [f"experiments.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            roots.add(parts[0])
            if parts[0] == "experiments" and len(parts) > 1:
                roots.add(".".join(parts[:2]))
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
    source.write_text("def f():\n    from experiments.tasks.vae import x\n    import lightning.pytorch as L\n")
    assert imported_roots(source) == {"experiments", "experiments.tasks", "lightning"}


@pytest.mark.parametrize(
    "line",
    ["from experiments.sweeps.compare import rows", "from experiments import sweeps", "import experiments.cli"],
)
def test_a_task_importing_a_layer_above_it_is_rejected(tmp_path, line):
    source = tmp_path / "task.py"
    source.write_text(f"def f():\n    {line}\n")
    assert imported_roots(source) & FORBIDDEN["experiments/tasks"]
