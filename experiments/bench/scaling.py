"""SiameseNorm's (or any scheme's) overhead as a function of scale: ``python -m experiments bench --scaling``.

``--schemes pre,mhc`` (``pre`` and any others, not ``all``) sweeps those schemes against ``pre`` instead of
SiameseNorm: ``--scaling --schemes pre,mhc`` gives mHC's rows, one table per scheme.

The LM (SwiGLU, RMSNorm, QK-norm, no biases: the presets' flavour) at growing width with the depth fixed, and
at growing depth with the width fixed; at every shape ``pre`` and ``siamese`` interleaved exactly as in the
main benchmark (:func:`experiments.bench.run.bench_task`), giving the paired siamese/pre step-time ratio, the
saved-activation ratio and, from the profiler, the share of step time spent in norms. Norms cost O(N D) per
sublayer and the matmuls O(N D^2), so the step-time ratio should fall as width grows; the extra activation
(SiameseNorm's second stream: one D-vector per token per sublayer, against a dozen that both keep) does not
shrink with width, and the table says so where it does not.

Writes ``scaling.md``, ``scaling.csv`` and ``scaling.png`` (ratios and norm share against width and depth).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from experiments.bench.measure import Options
from experiments.bench.report import Row, Target
from experiments.bench.run import RunSpec, bench_task
from experiments.bench.workloads import Workload, lm_workload
from models.schemes import NormScheme


@dataclass
class ScalingRow:
    """One shape of the sweep: a candidate scheme (``siamese`` unless chosen) against pre; the ``*_siamese`` fields
    are the candidate's."""

    axis: str  # "width" or "depth"
    dim: int
    depth: int
    num_heads: int
    params_pre: int
    step_ms_pre: float
    step_ms_siamese: float
    step_ratio: float
    act_mb_pre: float
    act_ratio: float
    norm_share_pre: float
    norm_share_siamese: float
    candidate: str = "siamese"


SCALING_COLUMNS = [f.name for f in fields(ScalingRow)]


def scaling_workloads(
    widths: Sequence[int], depths: Sequence[int], width_depth: int, depth_width: int, batch: int, seq: int
) -> list[tuple[str, Workload]]:
    """``(axis, workload)``: every width at ``width_depth`` blocks, then every depth at ``depth_width``.

    Heads of 64 channels (at least 2), MLP hidden 4D, ``batch`` sequences of ``seq`` tokens, byte vocabulary.
    """

    def shape(dim: int, depth: int) -> Workload:
        return lm_workload(batch, seq, dim=dim, depth=depth, num_heads=max(2, dim // 64), mlp_hidden=4 * dim)

    return [("width", shape(d, width_depth)) for d in widths] + [("depth", shape(depth_width, L)) for L in depths]


def scaling_candidates(labels: Sequence[str]) -> tuple[str, ...]:
    """The schemes swept against ``pre``: SiameseNorm for every scheme (``--schemes all``, the default), else the
    labels given other than ``pre``."""
    chosen = tuple(label for label in labels if label != "pre")
    return ("siamese",) if not chosen or len(labels) >= len(NormScheme) else chosen


def bench_scaling(shapes: Sequence[tuple[str, Workload]], spec: RunSpec, opts: Options) -> list[ScalingRow]:
    """Every shape through :func:`bench_task` with ``pre`` and the candidates (:func:`scaling_candidates` of
    ``spec.schemes``) interleaved, norm shares on; one row per shape and candidate."""
    candidates = scaling_candidates(spec.schemes)
    spec = RunSpec(("pre", *candidates), spec.steps, spec.warmup, spec.seed, reference=False, norm_share=True,
                   recompute_norms=spec.recompute_norms)  # fmt: skip
    out = []
    for axis, w in shapes:
        t = w.trunk
        rows, _ = bench_task(w, f"d{t['dim']}x{t['depth']}", spec, opts)
        pre = next(r for r in rows if r.name == "pre")
        for name in candidates:
            out.append(_row(axis, w, pre, next(r for r in rows if r.name == name), name))
    return out


def _row(axis: str, w: Workload, pre: Row, cand: Row, name: str = "siamese") -> ScalingRow:
    t = w.trunk
    return ScalingRow(
        axis, t["dim"], t["depth"], t["num_heads"], pre.params, pre.step_ms, cand.step_ms, cand.step_ratio,
        pre.act_mb, cand.act_ratio, pre.norm_share, cand.norm_share, name,
    )  # fmt: skip


def _candidates(rows: Sequence[ScalingRow]) -> list[str]:
    return list(dict.fromkeys(r.candidate for r in rows))


def scaling_targets(rows: Sequence[ScalingRow]) -> list[Target]:
    """Both candidate/pre ratios fall toward 1 as width grows: at the widest shape below the narrowest."""
    out = []
    for cand in _candidates(rows):
        width = sorted((r for r in rows if r.axis == "width" and r.candidate == cand), key=lambda r: r.dim)
        if len(width) < 2:
            continue
        lo, hi = width[0], width[-1]
        for what, a, b in (("step time", lo.step_ratio, hi.step_ratio),
                           ("activation memory", lo.act_ratio, hi.act_ratio)):  # fmt: skip
            # value: how much of the narrow shape's overhead is left at the wide one (< 1: it fell)
            left = (b - 1) / (a - 1) if a != 1 else math.nan
            out.append(Target(f"scaling: {cand}/pre {what} overhead at d{hi.dim} over d{lo.dim} ({b:.3f} vs {a:.3f})",
                              left, 1.0, at_most=True))  # fmt: skip
    return [t for t in out if not math.isnan(t.value)]


def scaling_markdown(rows: Sequence[ScalingRow], header: dict[str, str]) -> str:
    names = _candidates(rows) or ["siamese"]
    title = "SiameseNorm" if names == ["siamese"] else ", ".join(names)
    lines = [f"# {title} overhead vs scale (LM)", ""]
    lines += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    for cand in names:
        head = ["axis", "width", "depth", "heads", "params (pre)", "pre step ms", f"{cand}/pre step", "pre act MB",
                f"{cand}/pre act", "norm share pre", f"norm share {cand}"]  # fmt: skip
        lines += ["", "| " + " | ".join(head) + " |", "| --- | " + " | ".join(["---:"] * (len(head) - 1)) + " |"]
        for r in (r for r in rows if r.candidate == cand):
            cells = [r.axis, str(r.dim), str(r.depth), str(r.num_heads), f"{r.params_pre:,}", f"{r.step_ms_pre:,.1f}",
                     f"{r.step_ratio:.3f}", f"{r.act_mb_pre:,.1f}", f"{r.act_ratio:.3f}", _pct(r.norm_share_pre),
                     _pct(r.norm_share_siamese)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    if goals := scaling_targets(rows):
        lines += ["", "## Targets (value: overhead left at the widest shape, as a share of the narrowest's)", ""]
        lines += [g.line() for g in goals]
    return "\n".join(lines) + "\n"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def plot_scaling(rows: Sequence[ScalingRow], path: Path) -> None:
    """Two panels (against width, against depth): both ratios on the left axis, norm shares on the right."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    axes_used = [a for a in ("width", "depth") if any(r.axis == a for r in rows)]
    fig, panels = plt.subplots(1, len(axes_used), figsize=(6 * len(axes_used), 4.2), squeeze=False)
    names = _candidates(rows)
    for ax, axis in zip(panels[0], axes_used, strict=True):
        part = sorted((r for r in rows if r.axis == axis and r.candidate == names[0]),
                      key=lambda r: r.dim if axis == "width" else r.depth)  # fmt: skip
        x = [r.dim if axis == "width" else r.depth for r in part]
        for cand in names:
            mine = sorted((r for r in rows if r.axis == axis and r.candidate == cand),
                          key=lambda r: r.dim if axis == "width" else r.depth)  # fmt: skip
            tag = "" if len(names) == 1 else f" ({cand})"
            ax.plot(x, [r.step_ratio for r in mine], "o-", label=f"step time{tag}")
            ax.plot(x, [r.act_ratio for r in mine], "s-", label=f"activation memory{tag}")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(v) for v in x])
        fixed = f"depth {part[0].depth}" if axis == "width" else f"width {part[0].dim}"
        ax.set_xlabel(f"model {axis} ({fixed})")
        ax.set_ylabel(f"{' | '.join(names)} / pre")
        share = ax.twinx()
        share.plot(x, [100 * r.norm_share_pre for r in part], "^--", color="tab:green", label="norm share (pre)")
        for cand in names:
            mine = sorted((r for r in rows if r.axis == axis and r.candidate == cand),
                          key=lambda r: r.dim if axis == "width" else r.depth)  # fmt: skip
            share.plot(x, [100 * r.norm_share_siamese for r in mine], "v--", label=f"norm share ({cand})")
        share.set_ylabel("% of step time in norms")
        lines = ax.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
        ax.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc="best")
        ax.set_title(f"{', '.join(names)} overhead vs {axis}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_scaling(out: Path, rows: Sequence[ScalingRow], header: dict[str, str]) -> str:
    """``scaling.md``, ``scaling.csv`` and ``scaling.png`` in ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    text = scaling_markdown(rows, header)
    (out / "scaling.md").write_text(text + "\n![scaling](scaling.png)\n")
    with open(out / "scaling.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SCALING_COLUMNS)
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    plot_scaling(rows, out / "scaling.png")
    return text
