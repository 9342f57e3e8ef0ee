"""The code an export carries is generated from the suite's own source: one file, no suite imports, the same
network (every scheme registered, equal outputs); constructs that cannot be bundled are refused by name."""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from experiments.sharing import diffusers_export, hf, timm_export
from experiments.sharing.source import REPO_ROOT, SUITE_PACKAGES, BundleError, bundle, collect
from models import SCHEMES, LanguageModel
from tests.experiments.sharing.conftest import trunk

EXPORTED = {  # what each format writes: (entry module, modules kept as sibling files)
    "hf config": (hf.CONFIG_MODULE, {}),
    "hf model": (hf.MODEL_MODULE, {hf.CONFIG_MODULE: hf.CONFIG_STEM}),
    "timm": (timm_export.CODE_MODULE, {}),
    "diffusers model": (diffusers_export.MODEL_MODULE, {}),
    "diffusers pipeline": (diffusers_export.PIPELINE_MODULE, {}),
}


def suite_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        found += [n for n in names if n.split(".")[0] in SUITE_PACKAGES]
    return found


@pytest.mark.parametrize("what", EXPORTED)
def test_each_exported_file_imports_nothing_of_the_suite(what):
    entry, elsewhere = EXPORTED[what]
    source = bundle([entry], elsewhere)
    assert suite_imports(source) == []
    modules = [m.relative_path for m in collect([entry], elsewhere)]
    assert modules[-1].removesuffix(".py").replace("/", ".") == entry  # dependencies first, the entry last
    if entry in (hf.MODEL_MODULE, timm_export.CODE_MODULE, diffusers_export.MODEL_MODULE):
        # every scheme module the registry imports travels along (a new scheme file is picked up by itself)
        scheme_files = {f"models/schemes/{p.name}" for p in (REPO_ROOT / "models" / "schemes").glob("*.py")}
        assert scheme_files <= set(modules)
    for stem in elsewhere.values():
        assert f"from .{stem} import " in source


def test_the_bundled_network_is_the_suites(tmp_path):
    path = tmp_path / "bundled_lm.py"
    path.write_text(bundle(["models.lm"]))
    spec = importlib.util.spec_from_file_location("bundled_lm", path)
    bundled = importlib.util.module_from_spec(spec)
    sys.modules["bundled_lm"] = bundled
    try:
        spec.loader.exec_module(bundled)
    finally:
        del sys.modules["bundled_lm"]
    assert sorted(bundled.SCHEMES) == sorted(SCHEMES)  # every scheme registered in the copy
    for name in ("siamese", "hyper"):
        config = trunk(name, mlp="swiglu", norm_layer="rmsnorm")
        ours = LanguageModel(config, 64, 16).eval()
        theirs = bundled.LanguageModel(bundled.TrunkConfig(**config.to_dict()), 64, 16).eval()
        theirs.load_state_dict(ours.state_dict())
        ids = torch.randint(0, 64, (2, 16))
        with torch.no_grad():
            assert torch.equal(theirs(ids), ours(ids))


def fake_suite(root: Path, files: dict[str, str]) -> Path:
    for name, text in {"models/__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def test_imports_become_globals_aliases_assignments_and_nested_ones_pass(tmp_path):
    root = fake_suite(tmp_path, {
        "models/base.py": '"""Base."""\nfrom __future__ import annotations\nimport math\n\nTWO = 2.0\n\n'
                          "def root2():\n    return math.sqrt(TWO)\n",
        "models/top.py": "from models.base import TWO as two, root2\n\n__all__ = ['f']\n\n"
                         "def f():\n    from models.base import TWO\n    return two * root2()\n",
    })  # fmt: skip
    source = bundle(["models.top"], root=root)
    assert [m.relative_path for m in collect(["models.top"], root=root)] == ["models/base.py", "models/top.py"]
    assert "two = TWO\n" in source and "    pass\n" in source and "__all__" not in source
    namespace: dict = {}
    exec(compile(source, "bundle", "exec"), namespace)
    assert namespace["f"]() == pytest.approx(2 * 2**0.5)


G = "def g(): return 1\n"
REFUSED = {
    "cycle": ({"models/a.py": "from models.b import g\n", "models/b.py": "from models.a import f\n"}, "import cycle"),
    "collision": ({"models/a.py": "from models.b import g\ndef f(): return g()\n", "models/b.py": G + "def f(): ...\n"},
                  "names defined twice would collide in one file: f"),
    "module-object": ({"models/a.py": "from models import b\ndef f(): return b.g()\n", "models/b.py": G},
                      "uses the module models.b as an object"),
    "relative": ({"models/a.py": "from .b import g\n", "models/b.py": G}, "uses a relative import"),
    "import-module": ({"models/a.py": "import models.b\n", "models/b.py": G}, "imports a suite module as an object"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_what_cannot_be_bundled_is_refused_by_name(tmp_path, case):
    files, message = REFUSED[case]
    with pytest.raises(BundleError, match=message):
        bundle(["models.a"], root=fake_suite(tmp_path, files))


def test_a_package_importing_submodules_for_their_side_effects_bundles_them(tmp_path):
    root = fake_suite(tmp_path, {
        "models/reg/__init__.py": "from models.reg import one, two  # noqa: F401\nfrom models.reg.base import TABLE\n",
        "models/reg/base.py": "TABLE = {}\n",
        "models/reg/one.py": "from models.reg.base import TABLE\nTABLE['one'] = 1\n",
        "models/reg/two.py": "from models.reg.base import TABLE\nTABLE['two'] = 2\n",
    })  # fmt: skip
    namespace: dict = {}
    exec(compile(bundle(["models.reg"], root=root), "bundle", "exec"), namespace)
    assert namespace["TABLE"] == {"one": 1, "two": 2}
