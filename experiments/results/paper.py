"""README's table "Paper numbers next to this suite's": each of the paper's claims with its value, this suite's
measurement of the same claim with its uncertainty, the command that produced it, and a computed verdict.

    <!-- results:docs/results/paper.yaml:paper -->     a README block, filled by ``python -m experiments readme``
    <!-- /results -->

The claims, the paper's values and where each is measured here are data (``docs/results/paper.yaml``, strings
and numbers, documented at its top); the measurements are read from the exports it names, so the table
changes when an export does and ``readme --check`` sees it. Verdicts, per compared cell, from the slice's
randomized-block analysis against ``versus`` (:mod:`experiments.results.verdicts`, the same analysis as the
exported tables' ``verdict`` column):

    better / worse        Dunnett's many-to-one test on the block model (or, where the cells' spreads differ,
                          each cell's paired t-test with Holm), family-wise p < alpha, by the metric's direction;
                          the paper's claim holds where it says better
    equivalent within ±δ  TOST at the metric's margin (the paper file's ``margins``, else the documented default)
    undecided (n = k)     neither, with the seeds the pooled analysis needs and the smallest difference it detects
    not comparable        a side has no finished run, or they were tested under different protocols
    not measured yet      the export does not exist: the command column says what produces it

``tuned`` rows read a ``tune_then_compare`` sweep's export (:mod:`experiments.sweeps.protocol`): per scheme its
picked learning rate, its learning-rate sensitivity (Wortsman et al. 2023) and largest stable rate from the
export's ``tuning.yaml``, and the fresh-seed verdict against the baseline at the baseline's own rate; until the
export exists the row says "pending: the sweep has not finished". ``fail`` rows hold when every run of the
named cells failed (diverged or stalled); ``params`` rows when
SiameseNorm adds less than the paper's share of parameters to each preset; ``bench`` rows when the exported
benchmark's change is within the paper's (a step time is inconclusive while its interquartile range overlaps
Pre-Norm's: timing noise, unlike the activation bytes, depends on the machine's load).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from experiments.reliability.errors import SuiteError
from experiments.results.cells import OK, PRIMARY, Cell, slice_verdicts, varying_axes
from experiments.results.compare import Comparison, load_comparison
from experiments.results.equivalence import default_margin
from experiments.results.records import TUNING_RECORD, read_record
from experiments.results.runs import SWEEP_RECORD
from experiments.results.stats import PairedComparison, estimate, paired
from experiments.results.tables import fmt_amount, fmt_estimate, fmt_p

KINDS = ("compare", "fail", "params", "measure", "tuned")  # how a row is measured (see the paper file's header)
PENDING = "pending: the sweep has not finished"  # a tuned row before its export (with tuning.yaml) exists
FAILED = ("diverged", "stalled")
BENCH_MEASURES = ("throughput", "activation_memory")


@dataclass(frozen=True)
class Line:
    """One measured line of a row: what it compared, its numbers, and the verdict."""

    label: str
    text: str
    verdict: str


##################################################################################
#                               The paper file                                   #
##################################################################################


def load_paper(path: Path) -> dict:
    """The paper file, checked: ``alpha``, ``overhead`` and ``rows`` each with a claim, the paper's value, a
    command and one way of measuring it."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        first = str(err).splitlines()[0]
        raise SuiteError(f"{path}: cannot be read as YAML ({first}); valid: the paper file") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise SuiteError(f"{path}: holds no `rows` list; valid: a mapping with alpha, overhead and rows")
    for i, row in enumerate(data["rows"]):
        problem = _row_problem(row)
        if problem:
            claim = row.get("claim") if isinstance(row, dict) else None
            raise SuiteError(f"{path} row {i + 1}" + (f" ({claim})" if claim else "") + f": {problem}")
    return data


def _row_problem(row) -> str | None:
    """What is wrong with one row of the paper file (None: nothing)."""
    if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("claim", "paper", "command")):
        return "needs the strings claim, paper and command"
    kinds = [k for k in KINDS if k in row]
    if len(kinds) != 1:
        return f"has {kinds or 'none'} of {', '.join(KINDS)}; valid: exactly one"
    kind = kinds[0]
    if kind == "tuned":
        if not isinstance(row.get("export"), str) or row.get("better") not in ("lower", "higher"):
            return "`tuned` needs `export` (an exported tune_then_compare sweep) and `better` (lower, higher)"
        if not isinstance(row["tuned"], list) or not row["tuned"] or not all(isinstance(s, str) for s in row["tuned"]):
            return "`tuned` must list the schemes compared with the sweep's baseline, e.g. [siamese, post]"
    if kind in ("compare", "fail"):
        entries = row[kind]
        if not isinstance(row.get("export"), str):
            return f"`{kind}` needs `export`, the directory of an exported comparison"
        if (
            not isinstance(entries, list)
            or not entries
            or not all(isinstance(e, dict) and "scheme" in e for e in entries)
        ):
            return f"`{kind}` must list cells, each a mapping with a scheme"
    if kind == "compare" and row.get("better") not in ("lower", "higher"):
        return f"better={row.get('better')!r}; valid: lower, higher"
    if kind == "measure" and (row["measure"] not in BENCH_MEASURES or not isinstance(row.get("bench"), str)):
        return f"`measure` needs `bench` (an exported bench.csv) and one of {', '.join(BENCH_MEASURES)}"
    return None


##################################################################################
#                         Measurements from sweep exports                        #
##################################################################################


def _label(coords: dict) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in coords.items())


def _matching(cells: list[Cell], want: dict) -> list[Cell]:
    def same(a, b) -> bool:
        if isinstance(a, int | float) and isinstance(b, int | float):
            return math.isclose(a, b, rel_tol=1e-9)
        return a == b

    return [c for c in cells if all(same(c.coords.get(k), v) for k, v in want.items())]


def _sampling_note(root: Path, row: dict, cell: Cell, ref: Cell, versus: PairedComparison) -> str:
    """Where a test metric is measured on a finite sample (FID from 500 samples), how much of the paired spread
    the sample count alone explains: the per-run standard deviations over resamples (``row["sampling"]``, a CSV
    of ``run,std`` written from ``fid --bootstrap``) give the sampling variance of each paired difference
    (var_a + var_b); against the observed paired variance it says whether samples or seeds dominate."""
    path = root / row["sampling"]
    if not path.is_file() or versus.n < 2 or not versus.difference.std:
        return ""
    with path.open(newline="") as f:
        spread = {r["run"]: float(r["std"]) for r in csv.DictReader(f)}
    runs = {side: {r.get("seed"): r["run"] for r in c.runs} for side, c in (("a", cell), ("b", ref))}
    try:
        variances = [spread[runs["a"][k]] ** 2 + spread[runs["b"][k]] ** 2 for k in versus.keys]
    except KeyError:
        return ""
    sampling = math.sqrt(sum(variances) / len(variances))
    share = sampling**2 / versus.difference.std**2
    who = ("the sample count dominates" if share > 0.6 else "the seeds dominate" if share < 0.4
           else "samples and seeds weigh about equally")  # fmt: skip
    return (f"; SD of Δ from the sample count alone {fmt_amount(sampling)} of {fmt_amount(versus.difference.std)} "
            f"({100 * min(share, 1.0):.0f} % of its variance): {who}")  # fmt: skip


def _compare_line(
    comparison: Comparison,
    entry: dict,
    key: str,
    metric: str,
    margin: float | None,
    sampled: tuple[Path, dict] | None = None,
) -> list[Line]:
    entry = dict(entry)
    versus_scheme = entry.pop("versus", None) or comparison.baseline
    # a staged sweep's looks were spent against its own baseline on its own metric: read so only there
    own = versus_scheme == comparison.baseline and key == PRIMARY
    reading = comparison.reading if own else replace(comparison.reading, staging=None)
    verdicts = slice_verdicts(comparison.cells, versus_scheme, metric, margin, key=key, reading=reading)[0]
    cells = _matching(comparison.cells, entry)
    if not cells:
        return [Line(_label(entry), f"{_label(entry)}: no such cell in the export", "not comparable")]
    axes = [a for a in varying_axes(comparison.cells) if a != "scheme"]  # what tells the cells apart
    lines = []
    for cell in cells:
        where = _label({a: cell.coords[a] for a in axes if cell.coords.get(a) is not None})
        label = ", ".join(x for x in (f"{cell.scheme} vs {versus_scheme}", where) if x)  # names the verdict's line
        ref = next(iter(_matching(comparison.cells, {**dict(cell.key), "scheme": versus_scheme})), None)
        if ref is None:
            lines.append(Line(label, f"{cell.scheme}: no {versus_scheme} cell to pair with", "not comparable"))
            continue
        values, base = cell.values(key), ref.values(key)
        head = (f"{where}: " if where else "") + f"{cell.scheme} {fmt_estimate(estimate(list(values.values())))}"
        head += f" vs {ref.scheme} {fmt_estimate(estimate(list(base.values())))}"
        if key.startswith("test/") and cell.protocols() != ref.protocols():
            lines.append(Line(label, head + " (different test protocols)", "not comparable"))
            continue
        if not values or not base:
            failed = cell if not values else ref
            counts = ", ".join(f"{n} {s}" for s, n in failed.counts().items() if s != OK)
            lines.append(Line(label, f"{head} ({failed.scheme}: {counts})", "not comparable"))
            continue
        result = paired(values, base)
        if result is None:
            lines.append(Line(label, f"{head} (no seed in common)", "not comparable"))
            continue
        diff = fmt_estimate(result.difference, signed=True)
        p = fmt_p(result.p_t)
        tail = f"; Δ {diff}" + ("" if result.p_t is None else f", p {p}" if p.startswith("<") else f", p = {p}")
        if sampled is not None:
            tail += _sampling_note(*sampled, cell, ref, result)
        lines.append(Line(label, head + tail, verdicts[cell.key].text()))
    return lines


def _fail_lines(comparison: Comparison, row: dict) -> list[Line]:
    lines, failed_all, total_all = [], 0, 0
    axes = [a for a in varying_axes(comparison.cells) if a != "scheme"]
    for entry in row["fail"]:
        for cell in _matching(comparison.cells, entry):
            counts = cell.counts()
            failed, total = sum(counts.get(s, 0) for s in FAILED), sum(counts.values())
            failed_all, total_all = failed_all + failed, total_all + total
            how = ", ".join(f"{counts[s]} {s}" for s in FAILED if counts.get(s)) or "none"
            where = _label({a: cell.coords[a] for a in axes if cell.coords.get(a) is not None})
            name = ", ".join(x for x in (cell.scheme, where) if x)
            lines.append(Line(name, f"{name}: {failed} of {total} runs failed ({how})", ""))
    if not total_all:
        return [Line("", "no such cells in the export", "not comparable")]
    stalled_only = all("diverged" not in line.text for line in lines)
    if failed_all == total_all:
        word = "holds" + (" (they stall, none diverges)" if stalled_only else "")
    else:
        word = "does not" if failed_all == 0 else f"partly ({failed_all} of {total_all} runs failed)"
    return [Line(line.label, line.text, word) for line in lines]


##################################################################################
#                          Parameters and the benchmark                          #
##################################################################################


def _param_lines(row: dict, limit: float) -> list[Line]:
    from models.presets import build_preset, count_params

    lines = []
    for name in row["params"]:
        pre, siamese = count_params(build_preset(name, "pre")), count_params(build_preset(name, "siamese"))
        extra = siamese / pre - 1
        lines.append(Line(name, f"{name}: +{100 * extra:.3f} % ({siamese - pre:,} of {pre:,})",
                          "holds" if extra < limit else "does not"))  # fmt: skip
    return lines


def _quartiles_overlap(a: dict, b: dict) -> bool:
    """Whether two bench rows' step-time interquartile ranges overlap (or a row has none)."""
    try:
        lo_a, hi_a, lo_b, hi_b = (float(r[k]) for r in (a, b) for k in ("step_ms_p25", "step_ms_p75"))
    except (KeyError, TypeError, ValueError):
        return True
    return lo_a <= hi_b and lo_b <= hi_a


def _bench_lines(root: Path, row: dict, overhead: dict) -> list[Line] | None:
    path = root / row["bench"]
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("group") == "schemes" and r.get("baseline") == "pre"]
    measure, lines = row["measure"], []
    pre = next((r for r in rows if r["name"] == "pre"), None)
    for r in rows:
        if not r["name"].startswith("siamese"):
            continue
        where = f"{r['task']}/{r['size']} {r['name']} vs pre"
        if measure == "throughput":
            change, limit = 1 / float(r["step_ratio"]) - 1, overhead["throughput"]
            word = "holds" if change >= limit else "does not"
            if pre is None or _quartiles_overlap(r, pre):  # step times are noisy; activation bytes are not
                word = "inconclusive (step-time quartiles overlap)"
        else:
            change, limit = float(r["act_ratio"]) - 1, overhead["activation_memory"]
            word = "holds" if change <= limit else "does not"
        lines.append(Line(r["name"], f"{where}: {100 * change:+.1f} %", word))
    return lines or [Line("", f"{row['bench']} has no siamese row against pre", "not comparable")]


##################################################################################
#                                   The table                                    #
##################################################################################


def _tuned_lines(root: Path, row: dict, paper: dict) -> list[Line]:
    """Each scheme at its own best rate (a ``tune_then_compare`` sweep's export): its picked rate, its
    learning-rate sensitivity (Wortsman et al. 2023) and largest stable rate from ``tuning.yaml``, then the
    fresh-seed comparison with the baseline at the baseline's own rate and its verdict. Before the export (and
    its ``tuning.yaml``) exists: :data:`PENDING`."""
    export = root / row["export"]
    if not (export / SWEEP_RECORD).is_file() or not (export / TUNING_RECORD).is_file():
        return [Line("", PENDING, "pending")]
    record = read_record(export / TUNING_RECORD, "tuning", ("groups", dict), {}, "", "", str(export))
    comparison = load_comparison(export)
    groups, baseline = record["groups"], comparison.baseline
    metric = comparison.metric
    margins = {**(paper.get("margins") or {}), **comparison.reading.margins}
    lines = []
    for i, scheme in enumerate(row["tuned"]):
        if scheme not in groups or baseline not in groups:
            missing = scheme if scheme not in groups else baseline
            lines.append(Line(scheme, f"{missing}: not in {row['export']}/{TUNING_RECORD}", "not comparable"))
            continue
        (line,) = _compare_line(comparison, {"scheme": scheme}, PRIMARY, metric, margins.get(metric,
                                default_margin(metric)))  # fmt: skip
        head = f"`{metric}` at each scheme's picked rate, fresh seeds; {_tuning_text(baseline, groups[baseline])}<br>"
        lines.append(Line(line.label, (head if i == 0 else "") + f"{_tuning_text(scheme, groups[scheme])}: "
                          + line.text, line.verdict))  # fmt: skip
    return lines


def _tuning_text(scheme: str, entry: dict) -> str:
    """``siamese: lr 0.0158, LR sensitivity 0.31, largest stable lr 0.0398`` from a tuning.yaml group."""
    stable = entry.get("largest_stable_lr")
    stable = "none" if stable is None else f"{float(stable):g}"
    return (f"{scheme}: lr {float(entry['picked_lr']):g}, LR sensitivity {float(entry['sensitivity']):.3g}, "
            f"largest stable lr {stable}")  # fmt: skip


def measure_row(root: Path, row: dict, paper: dict) -> list[Line] | None:
    """The measured lines of one row, or None when its export (or bench file) does not exist yet (a tuned row:
    one :data:`PENDING` line)."""
    if "tuned" in row:
        return _tuned_lines(root, row, paper)
    if "params" in row:
        return _param_lines(row, paper["overhead"]["parameters"])
    if "measure" in row:
        return _bench_lines(root, row, paper["overhead"])
    export = root / row["export"]
    if not (export / SWEEP_RECORD).is_file():
        return None
    comparison = load_comparison(export)
    if "fail" in row:
        return _fail_lines(comparison, row)
    metric = row.get("metric", comparison.metric)
    # a run row keeps every test metric under its name (so its protocol is checked); other metrics: the sweep's
    key = metric if metric.startswith("test/") or metric != comparison.metric else PRIMARY
    lines = []
    margins = {**(paper.get("margins") or {}), **(comparison.record.get("margins") or {})}
    margin = margins.get(metric, default_margin(metric))
    for entry in row["compare"]:
        sampled = (root, row) if isinstance(row.get("sampling"), str) else None
        lines += _compare_line(comparison, entry, key, metric, margin, sampled)
    return [Line(ln.label, f"`{metric}`, {ln.text}" if i == 0 else ln.text, ln.verdict) for i, ln in enumerate(lines)]


def _verdicts(lines: list[Line]) -> str:
    words = [ln.verdict for ln in lines]
    if len(set(words)) == 1:
        return words[0]
    return "<br>".join(f"{ln.label}: {ln.verdict}" if ln.label else ln.verdict for ln in lines)


def render(root: Path, path: str) -> str:
    """The markdown table of the paper file at ``root / path`` (ends with a newline)."""
    paper = load_paper(root / path)
    out = [
        "| claim | paper | this suite: mean ± 95 % CI (n), Δ paired by seed | command | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in paper["rows"]:
        lines = measure_row(root, row, paper)
        measured = "not measured yet" if lines is None else "<br>".join(ln.text for ln in lines)
        if row.get("here"):  # the setting this suite measures the claim in
            measured = f"*{row['here']}*<br>{measured}"
        judged = "not measured yet" if lines is None else _verdicts(lines)
        out.append(f"| {row['claim']} | {row['paper']} | {measured} | `{row['command']}` | {judged} |")
    alpha = float(paper.get("alpha", 0.05))
    out += [
        "",
        f"Verdicts are computed from the exports ({path}), one randomized-block analysis per slice of a sweep "
        "(metric ~ scheme + seed, seeds as blocks, one pooled residual variance; stalled, diverged and crashed runs "
        f"left out): **better** / **worse** = Dunnett's many-to-one test on it, family-wise p < {alpha:g} (p shown "
        "adjusted), by the metric's direction (the paper's claim holds where it says better); **equivalent within "
        f"±δ** = TOST at the metric's margin δ (0.02 nats of loss, 0.5 points of accuracy, 1 FID point), "
        f"Holm-adjusted, p < {alpha:g}; **undecided** = neither, with the seeds per cell the pooled analysis needs "
        "for 80 % power at the observed Δ and the smallest Δ its seeds detect. Where Brown-Forsythe rejects equal "
        "spread, each cell's own paired t-test with Holm across the slice; every verdict names its analysis. The "
        "p after Δ is the cell's own paired t-test, unadjusted. A row at each scheme's own best rate names, per "
        "scheme, the rate its tuning seeds picked, its LR sensitivity (Wortsman et al. 2023: the mean over the rate "
        "grid of min(final loss, initial loss) minus the grid's best, a diverged or stalled run counted as the "
        "initial loss) and its largest stable rate; its verdicts use the fresh seeds only. Overhead "
        "rows compare the measured change with the paper's, a step time only where its interquartile range and "
        "Pre-Norm's do not "
        "overlap. An export is written by `python -m experiments compare "
        "runs/<task>/<name> --export docs/results/<name>` after the command's sweep.",
    ]
    return "\n".join(out) + "\n"
