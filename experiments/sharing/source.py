"""The code an export carries: the suite's own modules gathered into one self-contained file.

An exported folder must load where the suite is not installed, yet the model it holds must stay the
suite's model, not a second copy kept by hand. So the modeling file is generated from the source the
suite runs, at export time::

    entry modules  ->  every suite module they import (transitively), dependencies first
                   ->  each module's text, verbatim, minus its imports of suite modules
                   ->  one file: external imports (torch, timm, ...) stay, suite names are now globals

The text is cut, never re-printed, so comments and formatting survive. An import of a suite module
becomes nothing (the name it brought is defined above it in the bundle) or, under ``as``, an
assignment; inside a function it becomes ``pass``. A module may be mapped to a sibling file instead
(``elsewhere``): its imports become relative (``from .configuration_x import X``), the layout
transformers' and diffusers' remote-code loaders follow (a flat folder, ``from .module import name``).

Refused (:class:`BundleError`, so a test catches it when the source changes): an import cycle, two
modules defining the same top-level name, a relative import, and a suite module used as an object
(``from models.schemes import hyper`` then ``hyper.X``; importing one for its side effects is fine).
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SUITE_PACKAGES = ("models", "experiments")
FUTURE = "from __future__ import annotations"


class BundleError(Exception):
    """The suite's source cannot be bundled as it stands (the message names the module and the construct)."""


@dataclass
class SourceModule:
    """One suite module: its dotted name, file, text and the suite modules it imports."""

    name: str
    relative_path: str  # e.g. "models/trunk.py"
    text: str
    tree: ast.Module
    deps: list[str] = field(default_factory=list)


def is_suite_module(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in SUITE_PACKAGES


def module_path(name: str, root: Path = REPO_ROOT) -> Path | None:
    """The file of suite module ``name`` under ``root`` (a package's ``__init__.py``), or None if there is none."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _read(name: str, root: Path) -> SourceModule:
    path = module_path(name, root)
    if path is None:
        raise BundleError(f"suite module {name} has no source file under {root}")
    text = path.read_text(encoding="utf-8")
    return SourceModule(name, path.relative_to(root).as_posix(), text, ast.parse(text, filename=str(path)))


def _suite_imports(module: SourceModule) -> list[ast.ImportFrom | ast.Import]:
    """Every import statement of ``module`` that names a suite module, at any depth, in source order."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                raise BundleError(
                    f"{module.relative_path}:{node.lineno} uses a relative import; the suite's are absolute"
                )
            if is_suite_module(node.module):
                found.append(node)
        elif isinstance(node, ast.Import) and any(is_suite_module(a.name) for a in node.names):
            raise BundleError(
                f"{module.relative_path}:{node.lineno} imports a suite module as an object "
                f"(import {node.names[0].name}); bundling needs `from package.module import name`"
            )
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _dependencies(module: SourceModule, elsewhere: dict[str, str], root: Path) -> list[str]:
    """The suite modules ``module`` needs in the bundle: each ``from X import a`` needs X, and X.a if a module."""
    deps: list[str] = []
    used = {n.id for n in ast.walk(module.tree) if isinstance(n, ast.Name)}
    used |= {
        n.value.id for n in ast.walk(module.tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    for node in _suite_imports(module):
        if node.module in elsewhere:
            continue
        if node.module != module.name:  # a package's __init__ importing its own submodules
            deps.append(node.module)
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            if module_path(sub, root) is not None and module_path(node.module, root).name == "__init__.py":
                if (alias.asname or alias.name) in used:
                    raise BundleError(
                        f"{module.relative_path}:{node.lineno} uses the module {sub} as an object; "
                        "import the names it needs instead"
                    )
                deps.append(sub)  # imported for its side effects (e.g. registering schemes)
    return list(dict.fromkeys(deps))


def collect(entries: list[str], elsewhere: dict[str, str] | None = None, root: Path = REPO_ROOT) -> list[SourceModule]:
    """The entry modules and every suite module they import, each after its dependencies.

    Raises:
        BundleError: an import cycle, or an import form :func:`bundle` cannot rewrite.
    """
    elsewhere = elsewhere or {}
    loaded: dict[str, SourceModule] = {}
    order: list[SourceModule] = []
    state: dict[str, str] = {}  # "visiting" | "done"

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise BundleError(f"import cycle: {' -> '.join((*chain, name))}")
        state[name] = "visiting"
        module = loaded.setdefault(name, _read(name, root))
        module.deps = _dependencies(module, elsewhere, root)
        for dep in module.deps:
            visit(dep, (*chain, name))
        state[name] = "done"
        order.append(module)

    for entry in entries:
        visit(entry, ())
    return order


def _bound(target: ast.expr) -> list[str]:
    """Names an assignment target binds: ``x``, ``x, y``; not ``x[k]`` or ``x.a`` (they change an existing object)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [name for element in target.elts for name in _bound(element)]
    return _bound(target.value) if isinstance(target, ast.Starred) else []


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a module defines at top level (functions, classes, assignments); not imports or ``__all__``."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {name for t in targets for name in _bound(t)}
    return names - {"__all__"}


def _check_collisions(modules: list[SourceModule]) -> None:
    owner: dict[str, str] = {}
    clashes = []
    for module in modules:
        for name in sorted(_top_level_names(module.tree)):
            if name in owner:
                clashes.append(f"{name} ({owner[name]} and {module.relative_path})")
            owner.setdefault(name, module.relative_path)
    if clashes:
        raise BundleError(f"names defined twice would collide in one file: {', '.join(clashes)}")


def _is_all(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)


def _docstring_node(tree: ast.Module) -> ast.stmt | None:
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def _rewrite(module: SourceModule, elsewhere: dict[str, str]) -> str:
    """The module's text with its suite imports, ``__future__`` import, ``__all__`` and docstring replaced."""
    lines = module.text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first line, last line) 1-based inclusive -> replacement text
    top = set(map(id, module.tree.body))
    for node in _suite_imports(module):
        indent = " " * node.col_offset
        if node.module in elsewhere:
            names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
            replacement = f"{indent}from .{elsewhere[node.module]} import {names}\n"
        else:
            aliases = [f"{indent}{a.asname} = {a.name}\n" for a in node.names if a.asname and a.asname != a.name]
            replacement = "".join(aliases) if id(node) in top else "".join(aliases) or f"{indent}pass\n"
        edits.append((node.lineno, node.end_lineno, replacement))
    for node in module.tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__" or _is_all(node):
            edits.append((node.lineno, node.end_lineno, ""))
    doc = _docstring_node(module.tree)
    if doc is not None:  # a module docstring in the middle of a file is a stray string: keep it as comments
        text = ast.get_docstring(module.tree, clean=True) or ""
        comment = "".join(f"# {line}".rstrip() + "\n" for line in text.splitlines())
        edits.append((doc.lineno, doc.end_lineno, comment))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1 : last] = [replacement]
    return "".join(lines).strip("\n") + "\n"


def bundle(entries: list[str], elsewhere: dict[str, str] | None = None, title: str = "", root: Path = REPO_ROOT) -> str:
    """One self-contained Python file holding ``entries`` and every suite module they need.

    Args:
        entries: dotted suite module names, e.g. ``["models.wrappers.hf_lm"]``.
        elsewhere: suite modules that stay separate files next to the bundle, by module name -> file stem;
            imports of them become ``from .<stem> import ...``.
        title: first line of the generated file's header.
        root: the directory the suite's packages live in (the repository).

    Raises:
        BundleError: the source uses a construct that cannot be bundled (see the module docstring).
    """
    elsewhere = elsewhere or {}
    modules = collect(entries, elsewhere, root)
    _check_collisions(modules)
    digest = hashlib.sha256("".join(m.text for m in modules).encode()).hexdigest()[:16]
    header = [
        f'"""{title or "Generated from the SiameseNorm suite"}',
        "",
        "Generated by `python -m experiments export` from the suite's own source; do not edit by hand, export",
        f"again. Source sha256 {digest}; modules, dependencies first:",
        "",
        *(f"    {m.relative_path}" for m in modules),
        '"""',
        "",
        FUTURE,
        "",
    ]
    sections = ["\n".join(["#" * 100, f"#  {m.relative_path}", "#" * 100, "", _rewrite(m, elsewhere)]) for m in modules]
    source = "\n".join(header) + "\n" + "\n\n".join(sections)
    ast.parse(source)  # a cut in the wrong place is a bug here, not in the user's folder
    return source
