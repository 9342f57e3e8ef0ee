"""What the docs point at exists: no file outside the repository, every linked file, every named config,
script and make target, every ``python -m experiments`` command and every ``python -m`` module, on README and
on every docs page; README stays a landing page whose map reaches every page."""

from __future__ import annotations

import importlib.util
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


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_make_target_and_command_a_page_names_exists(doc: Path):
    from experiments.__main__ import LIGHTNING_COMMANDS, TOOLS

    text = doc.read_text()
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    assert set(re.findall(r"\bmake ([a-z][\w-]*)", text)) <= targets
    commands = set(re.findall(r"python -m experiments ([a-z][\w-]*)", text))
    assert commands <= set(LIGHTNING_COMMANDS) | set(TOOLS), commands - set(LIGHTNING_COMMANDS) - set(TOOLS)
    modules = set(re.findall(r"python -m ([a-z_][\w.]*)", text)) - {"pytest"}
    missing = sorted(m for m in modules if importlib.util.find_spec(m) is None)
    assert not missing, f"{doc.name} runs modules that do not exist: {missing}"


def test_the_readme_names_its_commands_and_shows_the_paper_table():
    text = (ROOT / "README.md").read_text()
    assert set(re.findall(r"python -m experiments ([a-z][\w-]*)", text)) >= {"fit", "test", "sweep", "compare"}
    head = text.split("\n## ")[1]  # the first section: the two commands and what they do
    assert head.startswith("Two commands") and "make demo" in head and "make test" in head
    assert "<!-- results:docs/results/paper.yaml:paper -->" in text


def test_the_readme_is_a_landing_page_one_link_from_every_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    linked = {target.split("#")[0] for target in re.findall(r"\]\((docs/[^)\s]+\.md)(?:#[^)]*)?\)", text)}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages README does not link: {sorted(pages - linked)}"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces
    to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_to_a_section_lands_on_a_heading(doc: Path):
    assert github_anchor("Paper numbers next to this suite's") == "paper-numbers-next-to-this-suites"
    assert github_anchor("Generation metrics (the DiT protocol)") == "generation-metrics-the-dit-protocol"
    wrong = []
    for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", doc.read_text()):
        if target.startswith("http"):
            continue
        path, anchor = target.split("#", 1)
        page = doc if not path else doc.parent / path
        if page.is_file() and anchor not in headings(page):
            wrong.append(target)
    assert not wrong, f"{doc.name} links to sections that do not exist: {wrong}"
