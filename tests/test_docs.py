"""What the docs point at exists: no file outside the repository, every linked file, every named config,
script and make target, every ``python -m experiments`` command."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Files that exist only where this project was written, never in a user's clone.
OUTSIDE = re.compile(r"DESIGN\.md|STYLE\.md|\.\./shared|/work/shared")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    suffixes = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ""}
    files = [ROOT / name for name in out.stdout.splitlines()]
    return [p for p in files if p.is_file() and p.suffix in suffixes and p.name != Path(__file__).name]


def test_nothing_refers_to_a_file_users_do_not_have():
    hits = []
    for path in tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_linked_and_named_file_exists(doc: Path):
    text = doc.read_text()
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http", "#", "mailto:"))]
    named = re.findall(r"(?<![\w/.-])((?:configs|scripts|docs)/[\w./-]+\.(?:yaml|py|md|png))", text)
    missing = []
    for target in links:
        if not (doc.parent / target.split("#")[0]).exists():
            missing.append(target)
    for target in named:
        if "<" not in target and "*" not in target and not (ROOT / target).exists():
            missing.append(target)
    assert not missing, f"{doc.name} names files that do not exist: {sorted(set(missing))}"


def test_every_make_target_and_command_the_readme_names_exists():
    from experiments.__main__ import LIGHTNING_COMMANDS, TOOLS

    text = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    assert set(re.findall(r"\bmake ([a-z][\w-]*)", text)) <= targets
    commands = set(re.findall(r"python -m experiments ([a-z][\w-]*)", text))
    assert commands and commands <= set(LIGHTNING_COMMANDS) | set(TOOLS), commands - set(TOOLS)
