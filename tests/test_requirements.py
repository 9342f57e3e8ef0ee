"""Every third-party package the code or the tests import is named in requirements.txt or installed by the
Makefile, so a fresh machine's ``make test`` has it.

A package that arrives on this machine only as another package's dependency (or was installed by hand)
passes every test here and fails a fresh clone; this test reads the imports instead of trusting the venv.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"experiments", "models", "datamodules", "fileio", "tests", "scripts", "conftest"}
SKIP_DIRS = {".venv", "mutants", "runs", ".git", "build"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    """Distribution names in requirements.txt and in the Makefile's ``pip install`` lines."""
    names = set()
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(_normalize(re.split(r"[\[<>=!~; ]", line, maxsplit=1)[0]))
    for line in (ROOT / "Makefile").read_text().splitlines():
        if "pip install" in line:
            for token in line.split("pip install", 1)[1].split():
                if not token.startswith("-") and not token.startswith("$"):
                    names.add(_normalize(re.split(r"[\[<>=!~]", token, maxsplit=1)[0]))
    return names


def third_party_imports(paths) -> dict[str, str]:
    """Top-level module -> one file importing it, for every absolute import that is neither the standard
    library nor the project's own packages (imports inside functions included)."""
    found = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL:
                    found.setdefault(top, path.name if not path.is_relative_to(ROOT) else str(path.relative_to(ROOT)))
    return found


def undeclared(imports: dict[str, str], declared: set[str]) -> list[str]:
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, where in sorted(imports.items()):
        dists = {_normalize(d) for d in providers.get(module, [module])}
        if not dists & declared:
            missing.append(f"{module} (imported by {where}; provided by {', '.join(sorted(dists))})")
    return missing


def project_files():
    return [p for p in ROOT.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def test_every_imported_package_is_declared():
    missing = undeclared(third_party_imports(project_files()), declared_distributions())
    assert not missing, "imported but not in requirements.txt or the Makefile: " + "; ".join(missing)


def test_the_check_catches_a_package_only_present_as_a_dependency(tmp_path):
    # patsy (a statsmodels dependency) is never declared: importing it must be reported, under its module name
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    import patsy\n    from scipy import stats\n")
    imports = third_party_imports([planted])
    assert set(imports) == {"patsy", "scipy"}
    assert [m.split(" ")[0] for m in undeclared(imports, declared_distributions())] == ["patsy"]
    # the distribution name differs from the module name: PIL is pillow, yaml is pyyaml, sklearn scikit-learn
    assert not undeclared({"PIL": "x", "yaml": "x", "sklearn": "x", "olmo_eval": "x"}, declared_distributions())
