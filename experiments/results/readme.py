"""``python -m experiments readme [README.md] [--check]``: regenerate README's result blocks from exports.

A block is delimited by markers naming an exported comparison (``compare SWEEP --export DIR``) and what to
show of it:

    <!-- results:docs/results/stability:pivot -->
    (generated; do not edit by hand)
    <!-- /results -->

Kinds: ``table`` (one row per cell: ``mean ± 95 % CI (n)``, the paired difference to the baseline with its
p-values, runs by status, then the notes), ``pivot`` (schemes x the other swept axis, same numbers),
``runs`` (one row per run), ``notes`` (what the numbers mean, test protocols), ``figures`` (the exported
PNGs), and ``paper``, whose path is the paper file (``docs/results/paper.yaml``): the paper's claims next
to this suite's measurements of them, read from the exports it names (:mod:`experiments.results.paper`).
Paths are relative to the README. The text between the markers is replaced by what the code that
prints ``comparison.md`` prints, so README and the printed tables cannot drift; ``--check`` only reports
(exit 1) where they differ, which is what the test suite runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from experiments.reliability.errors import SuiteError
from experiments.results import paper
from experiments.results.compare import load_comparison
from experiments.results.runs import SWEEP_RECORD

BLOCK = re.compile(r"<!-- results:(?P<path>[^:\s>]+):(?P<kind>[a-z]+) -->\n(?P<body>.*?)<!-- /results -->", re.S)
KINDS = ("table", "pivot", "runs", "notes", "figures", "paper")


def render_block(root: Path, path: str, kind: str, where: str) -> str:
    """The generated text of one block (ends with a newline)."""
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
        return "".join(f"![{p.stem.replace('_', ' ')}]({path}/{p.name})\n" for p in pngs)
    return load_comparison(export_dir).block(kind)


def regenerate(text: str, root: Path, name: str = "README.md") -> tuple[str, list[str]]:
    """``text`` with every results block regenerated, and the ``path:kind`` of the blocks that changed."""
    changed: list[str] = []

    def replace(match: re.Match) -> str:
        line = text.count("\n", 0, match.start()) + 1
        body = render_block(root, match["path"], match["kind"], f"{name} line {line}")
        if body != match["body"]:
            changed.append(f"{match['path']}:{match['kind']} (line {line})")
        return f"<!-- results:{match['path']}:{match['kind']} -->\n{body}<!-- /results -->"

    return BLOCK.sub(replace, text), changed


def blocks(text: str) -> list[tuple[str, str]]:
    """``(path, kind)`` of every results block of a README."""
    return [(m["path"], m["kind"]) for m in BLOCK.finditer(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments readme", description=__doc__.split("\n\n")[0])
    parser.add_argument("readme", nargs="?", type=Path, default=Path("README.md"), help="default: README.md")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is out of date")
    args = parser.parse_args(argv)
    if not args.readme.is_file():
        raise SuiteError(f"{args.readme} does not exist; valid: a markdown file with <!-- results:DIR:KIND --> blocks")
    text = args.readme.read_text()
    new, changed = regenerate(text, args.readme.parent, str(args.readme))
    found = len(blocks(text))
    if args.check:
        for block in changed:
            print(f"{args.readme}: out of date: {block}", file=sys.stderr)
        print(f"{args.readme}: {found} results block(s), {len(changed)} out of date")
        return 1 if changed else 0
    if changed:
        args.readme.write_text(new)
    print(f"{args.readme}: {found} results block(s), {len(changed)} rewritten")
    return 0
