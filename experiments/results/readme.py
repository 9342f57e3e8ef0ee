"""``python -m experiments readme [PAGE ...] [--check]``: regenerate the result blocks of README and the docs pages.

Without a page it reads ``README.md`` and every ``docs/*.md`` (from the current directory), so one command and one
``--check`` cover every page that holds a block (README's paper table, ``docs/results.md``'s sweeps, ...).

A block is delimited by markers naming an exported comparison (``compare SWEEP --export DIR``) and what to
show of it:

    <!-- results:docs/results/stability:pivot -->
    (generated; do not edit by hand)
    <!-- /results -->

Kinds: ``table`` (one row per cell: ``mean ± 95 % CI (n)``, the paired difference to the baseline with its
p-values, runs by status, then the notes), ``pivot`` (schemes x the other swept axis, same numbers),
``runs`` (one row per run), ``notes`` (what the numbers mean, test protocols), ``verdicts`` (each verdict word
with the cells that have it and their adjusted numbers, for a page's "what holds"), ``figures`` (the exported
PNGs), and ``paper``, whose path is the paper file (``docs/results/paper.yaml``): the paper's claims next
to this suite's measurements of them, read from the exports it names (:mod:`experiments.results.paper`).
A block's path is relative to the repository root (the nearest folder above the page that holds it, the page's
own folder first), so the same marker works in ``README.md`` and in ``docs/results.md``; the links a block
writes (figures) are relative to the page. The text between the markers is replaced by what the code that
prints ``comparison.md`` prints, so the pages and the printed tables cannot drift; ``--check`` only reports
(exit 1) where they differ, which is what the test suite runs.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from experiments.reliability.errors import ArgumentParser, SuiteError
from experiments.results import paper
from experiments.results.compare import load_comparison
from experiments.results.runs import SWEEP_RECORD

BLOCK = re.compile(r"<!-- results:(?P<path>[^:\s>]+):(?P<kind>[a-z]+) -->\n(?P<body>.*?)<!-- /results -->", re.S)
KINDS = ("table", "pivot", "runs", "notes", "verdicts", "figures", "paper")


def find_root(page_dir: Path, path: str) -> Path:
    """The folder a block's path is relative to: the page's own, else the nearest one above it that holds
    ``path`` (the repository root, for a page under ``docs/``); the page's own when none does (the error then
    names the path as written)."""
    for folder in (page_dir, *page_dir.resolve().parents):
        if (folder / path).exists():
            return folder
    return page_dir


def render_block(root: Path, path: str, kind: str, where: str, page_dir: Path | None = None) -> str:
    """The generated text of one block (ends with a newline); ``root`` is the folder ``path`` is relative to,
    ``page_dir`` the page's folder, which the figure links are relative to (default: ``root``)."""
    export_dir = root / path
    if kind not in KINDS:
        raise SuiteError(f"results block kind {kind!r} ({where}); valid: {', '.join(KINDS)}")
    if kind == "paper":
        if not export_dir.is_file():
            raise SuiteError(f"{path} does not exist ({where}); valid: the paper file, e.g. docs/results/paper.yaml")
        return paper.render(root, path)
    if not (export_dir / SWEEP_RECORD).is_file():
        raise SuiteError(f"{path} has no {SWEEP_RECORD} ({where}); valid: a directory written by "
                         f"python -m experiments compare SWEEP_DIR --export {path}")  # fmt: skip
    if kind == "figures":
        pngs = sorted(export_dir.glob("*.png"))
        link = path if page_dir is None else Path(os.path.relpath(root / path, page_dir)).as_posix()
        return "".join(f"![{p.stem.replace('_', ' ')}]({link}/{p.name})\n" for p in pngs)
    return load_comparison(export_dir).block(kind)


def regenerate(text: str, page_dir: Path, name: str = "README.md") -> tuple[str, list[str]]:
    """``text`` (a page in ``page_dir``) with every results block regenerated, and the ``path:kind`` of the
    blocks that changed."""
    changed: list[str] = []

    def replace(match: re.Match) -> str:
        line = text.count("\n", 0, match.start()) + 1
        root = find_root(page_dir, match["path"])
        body = render_block(root, match["path"], match["kind"], f"{name} line {line}", page_dir)
        if body != match["body"]:
            changed.append(f"{match['path']}:{match['kind']} (line {line})")
        return f"<!-- results:{match['path']}:{match['kind']} -->\n{body}<!-- /results -->"

    return BLOCK.sub(replace, text), changed


def blocks(text: str) -> list[tuple[str, str]]:
    """``(path, kind)`` of every results block of a README."""
    return [(m["path"], m["kind"]) for m in BLOCK.finditer(text)]


def default_pages() -> list[Path]:
    """README.md and every docs/*.md of the current directory (the repository's pages)."""
    return [p for p in (Path("README.md"), *sorted(Path("docs").glob("*.md"))) if p.is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m experiments readme", description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="default: README.md and docs/*.md")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    pages = args.pages or default_pages()
    if not pages:
        raise SuiteError("no README.md or docs/*.md here; valid: run it in the repository, or name the pages")
    for page in pages:
        if not page.is_file():
            raise SuiteError(f"{page} does not exist; valid: a markdown file with <!-- results:DIR:KIND --> blocks")
    stale = 0
    for page in pages:
        text = page.read_text()
        found = len(blocks(text))
        if not found and not args.pages:
            continue  # a docs page without blocks: nothing to say
        new, changed = regenerate(text, page.parent, str(page))
        stale += len(changed)
        if args.check:
            for block in changed:
                print(f"{page}: out of date: {block}", file=sys.stderr)
            print(f"{page}: {found} results block(s), {len(changed)} out of date")
            continue
        if changed:
            page.write_text(new)
        print(f"{page}: {found} results block(s), {len(changed)} rewritten")
    return 1 if args.check and stale else 0
