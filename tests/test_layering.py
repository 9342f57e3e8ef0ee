"""The package layering the README promises: models/ is plain PyTorch, data never depends on the tasks, and
inside experiments/ each concern imports only the ones below it.

    fileio/                    the standard library only -- atomic writes and input checks every package shares
    models/                    torch, and diffusers for the VAE -- never lightning, experiments or datamodules
    datamodules/               lightning, torchvision, models -- never experiments
    experiments/reliability/   errors, checkpoints, run layout -- no other part of experiments
    experiments/monitoring/    callbacks -- reliability only
    experiments/evaluation/    metrics -- monitoring, reliability (a task calls evaluation, never the reverse)
    experiments/tasks/         LightningModules -- evaluation, monitoring, reliability; never sweeps, tools, cli
    experiments/results/       reading runs: comparisons, statistics, tables, plots -- never runs anything
    experiments/sweeps/        running grids of runs -- results below it; never the tasks (runs are processes)
    experiments/analysis/, bench/   tools -- never each other, never sweeps
    experiments/sharing/       export -- tasks, evaluation, monitoring, reliability; never sweeps, other tools, cli

Checked on the source (every import statement, including ones inside functions), so a lazy import
cannot slip through, and by importing the packages in a fresh interpreter. No module imports itself back
through others: the import graph of the whole code base has no cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "fileio": {"models", "datamodules", "experiments", "torch", "lightning", "numpy"},
    "models": {"lightning", "pytorch_lightning", "experiments", "datamodules"},
    "datamodules": {"experiments"},
    "experiments/reliability": {
        f"experiments.{p}"
        for p in ("tasks", "monitoring", "evaluation", "results", "sweeps", "analysis", "bench", "cli")
    },
    "experiments/monitoring": {
        f"experiments.{p}" for p in ("tasks", "evaluation", "results", "sweeps", "analysis", "bench", "cli")
    },
    "experiments/evaluation": {f"experiments.{p}" for p in ("tasks", "results", "sweeps", "analysis", "bench", "cli")},
    "experiments/tasks": {f"experiments.{p}" for p in ("results", "sweeps", "analysis", "bench", "cli")},
    "experiments/results": {f"experiments.{p}" for p in ("tasks", "sweeps", "analysis", "bench", "cli")},
    "experiments/sweeps": {f"experiments.{p}" for p in ("tasks", "analysis", "bench", "cli")},
    "experiments/analysis": {f"experiments.{p}" for p in ("results", "sweeps", "bench")},
    "experiments/bench": {f"experiments.{p}" for p in ("results", "sweeps", "analysis", "cli")},
    "experiments/sharing": {f"experiments.{p}" for p in ("results", "sweeps", "analysis", "bench", "cli")},
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


@pytest.mark.slow
def test_importing_models_loads_no_lightning():
    # experiments.parallel too: the plain-PyTorch half of scale-out, which the gradient-only worker processes of
    # tests/experiments/test_parallel.py import (Lightning would add ~3 s to each of their start-ups)
    code = (
        "import sys, pkgutil, importlib, models\n"
        "for m in pkgutil.walk_packages(models.__path__, 'models.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('lightning', 'pytorch_lightning'))\n"
        "assert not bad, bad[:5]\n"
        "import experiments.parallel\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('lightning', 'pytorch_lightning'))\n"
        "assert not bad, ('experiments.parallel', bad[:5])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1:]


def test_the_checker_sees_lazy_imports(tmp_path):
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from experiments.tasks.vae import x\n    import lightning.pytorch as L\n")
    assert imported_roots(source) == {"experiments", "experiments.tasks", "lightning"}


@pytest.mark.parametrize(
    "line",
    ["from experiments.results.compare import rows", "from experiments import sweeps", "import experiments.cli"],
)
def test_a_task_importing_a_layer_above_it_is_rejected(tmp_path, line):
    source = tmp_path / "task.py"
    source.write_text(f"def f():\n    {line}\n")
    assert imported_roots(source) & FORBIDDEN["experiments/tasks"]


PACKAGES = ("fileio", "models", "datamodules", "experiments")


def module_files(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module under ``root``'s packages (a package is its __init__)."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Which of the code base's modules each module imports (function-level imports included)."""
    files = module_files(root)

    def resolve(name: str) -> str | None:  # the longest prefix that is a module of ours
        parts = name.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in files), None)

    graph = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {resolve(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets |= {resolve(f"{node.module}.{alias.name}") or resolve(node.module) for alias in node.names}
        graph[module] = targets - {None, module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_back_through_others():
    assert cycles(import_graph(ROOT)) == []


def test_the_cycle_check_finds_a_lazy_cycle(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "a.py").write_text("from models.b import g\n")
    (tmp_path / "models" / "b.py").write_text("def g():\n    from models import a\n")
    (tmp_path / "models" / "c.py").write_text("import models.a\n")
    assert cycles(import_graph(tmp_path)) == [["models.a", "models.b"]]
