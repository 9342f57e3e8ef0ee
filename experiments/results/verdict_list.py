"""The verdicts of an exported comparison as a few lines of prose: what a results page says holds, generated.

    <!-- results:docs/results/stability:verdicts -->     filled by ``python -m experiments readme``
    <!-- /results -->

One line per verdict word (better, worse, equivalent, undecided, not comparable), each cell named with its
coordinates and its verdict's own numbers (adjusted p-value or TOST p, n, analysis), so a page's "what holds"
never quotes an unadjusted p-value by hand and ``readme --check`` sees when an export changes it.
"""

from __future__ import annotations

from experiments.results.cells import PRIMARY, Cell, cell_stats, varying_axes
from experiments.results.reading import Reading
from experiments.results.verdicts import WORDS

HEADINGS = {"better": "Better than {b}", "worse": "Worse than {b}", "equivalent": "Equivalent to {b}",
            "undecided": "Undecided against {b}", "not comparable": "Not comparable with {b}"}  # fmt: skip


def _where(cell: Cell, axes: list[str]) -> str:
    parts = []
    for axis in axes:
        value = cell.coords.get(axis)
        if value is not None:
            parts.append(f"{axis} {value:g}" if isinstance(value, float) else f"{axis} {value}")
    return cell.scheme + (f" at {', '.join(parts)}" if parts else "")


def verdicts_markdown(cells: list[Cell], metric: str, baseline: str | None, reading: Reading | None = None) -> str:
    """A bullet per verdict word that some cell has: ``- **Better than pre** (val/loss): siamese (lr 0.01):
    Dunnett, block model: p = 0.0047, n = 3; ...``. Without a baseline: one line saying there is no verdict."""
    if not baseline:
        return "No baseline: the sweep's cells get no verdict.\n"
    axes = [a for a in varying_axes(cells) if a != "scheme"]
    found: dict[str, list[str]] = {}
    for stats in cell_stats(cells, PRIMARY, baseline, metric, reading):
        v = stats.verdict
        if stats.is_baseline or v is None:
            continue
        text = v.text()
        detail = text[len(v.word) :].strip() if text.startswith(v.word) else text
        found.setdefault(v.word, []).append(f"{_where(stats.cell, axes)} {detail}".rstrip())
    lines = [f"- **{HEADINGS[word].format(b=baseline)}** ({metric}): " + "; ".join(found[word]) + "."
             for word in WORDS if word in found]  # fmt: skip
    return "\n".join(lines) + "\n" if lines else f"No cell is paired with {baseline}.\n"
