"""The paper's overhead claim next to the benchmark's measurement.

SiameseNorm's paper reports its cost on a 15B MoE on GPUs: -0.5 % training throughput and +2 % activation
memory, and < 0.1 % parameters (and FLOPs). Those numbers live once, in ``docs/results/paper.yaml``
(``overhead``), which README's paper table reads too; here each SiameseNorm row of a bench (against ``pre``)
gets one line that puts its own throughput, activation-memory and parameter changes beside them. A bench
of a small model on a CPU measures this implementation at that size, not the paper's setting: the lines
say which is which and leave the verdict to the reader (README's table states one for the MoE bench).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import yaml

from experiments.bench.report import Row

PAPER_FILE = Path(__file__).resolve().parents[2] / "docs" / "results" / "paper.yaml"


def paper_overhead(path: Path = PAPER_FILE) -> dict | None:
    """``overhead`` of the paper file (fractions: ``throughput``, ``activation_memory``, ``parameters`` and the
    ``setting`` they were measured in), or None when the file is absent or holds no such mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    overhead = data.get("overhead") if isinstance(data, dict) else None
    return overhead if isinstance(overhead, dict) else None


def _pct(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:+.2f} %"


def claim_lines(rows: Sequence[Row], overhead: dict | None) -> list[str]:
    """One line per SiameseNorm row measured against ``pre``: its changes and the paper's, side by side."""
    if not overhead:
        return []
    lines = []
    for r in rows:
        if r.group != "schemes" or r.baseline != "pre" or not r.name.split("@")[0].startswith("siamese"):
            continue
        throughput = 1 / r.step_ratio - 1 if r.step_ratio > 0 else math.nan
        lines.append(
            f"- {r.task}/{r.size} {r.name} vs pre: throughput {_pct(throughput)} "
            f"(paper: {_pct(overhead['throughput'])}), activation memory {_pct(r.act_ratio - 1)} "
            f"(paper: {_pct(overhead['activation_memory'])}), parameters {_pct(r.param_ratio - 1)} "
            f"(paper: < {100 * overhead['parameters']:g} %)"
        )
    if lines:
        setting = overhead.get("setting", "?")
        lines.append(f"- the paper measured a {setting}; the lines above, this bench's model on this device and load")
    return lines
