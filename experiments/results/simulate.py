"""Null sweeps: how often the verdicts call a difference where there is none (the family-wise error).

    python -m experiments.results.simulate --sweeps 10000              # one look, 20 cells against the baseline
    python -m experiments.results.simulate --sweeps 10000 --looks 3,5,8  # staged seeds, Lan-DeMets spending

Every sweep draws one slice under the null: 20 cells plus the baseline, every cell the same mean, a seed effect
shared by the cells of a seed (the block) and independent noise per run. It is analysed exactly as the tables
analyse an export (:func:`experiments.results.verdicts.analyse`: Brown-Forsythe, then Dunnett on the block model
or each cell's paired t with Holm); a sweep is a false positive when any cell comes out better or worse. With
``--looks`` the seeds arrive in stages (the first ``3`` seeds, then ``5``, then ``8``), each look compared with
its Lan-DeMets O'Brien-Fleming level, and a sweep is a false positive when any look calls any cell. The
family-wise error should stay at or below alpha; its Monte-Carlo standard error is printed with it.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from experiments.results.verdicts import ALPHA, analyse, analyse_at_look

CELLS = 20
SEED_SD = 0.05  # the shared effect of a seed (block), larger than the noise as in the tiny-LM sweeps
NOISE_SD = 0.02


def null_slice(rng: np.random.Generator, cells: int, seeds: int) -> dict[str, dict[int, float]]:
    """One slice with no true difference: ``{scheme: {seed: value}}``, the baseline named ``base``."""
    block = rng.normal(0.0, SEED_SD, seeds)
    noise = rng.normal(0.0, NOISE_SD, (cells + 1, seeds))
    names = ["base", *(f"s{i}" for i in range(cells))]
    return {name: {k + 1: 2.0 + block[k] + noise[i, k] for k in range(seeds)} for i, name in enumerate(names)}


def called(analysis) -> bool:
    return any(v.word in ("better", "worse") for v in analysis.verdicts.values())


def family_error(sweeps: int, cells: int = CELLS, seeds: int = 3, seed: int = 0, alpha: float = ALPHA) -> float:
    """Share of null sweeps (one look, ``seeds`` seeds) in which some cell is called better or worse."""
    rng = np.random.default_rng(seed)
    hits = sum(called(analyse(null_slice(rng, cells, seeds), "base", "val/loss", None, alpha, sensitivity=False))
               for _ in range(sweeps))  # fmt: skip
    return hits / sweeps


def sequential_error(sweeps: int, looks: tuple[int, ...] = (3, 5, 8), cells: int = CELLS, seed: int = 0,
                     alpha: float = ALPHA) -> float:  # fmt: skip
    """Share of null sweeps called anywhere across staged looks at ``looks`` seeds (every cell gets every stage:
    under the null, stopping decided cells early can only lower the error)."""
    rng = np.random.default_rng(seed)
    fractions = [n / looks[-1] for n in looks]
    hits = 0
    for _ in range(sweeps):
        full = null_slice(rng, cells, looks[-1])
        for look, n in enumerate(looks, start=1):
            data = {s: {k: v for k, v in d.items() if k <= n} for s, d in full.items()}
            if called(analyse_at_look(data, "base", "val/loss", None, look, fractions, alpha, sensitivity=False)):
                hits += 1
                break
    return hits / sweeps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.results.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=int, default=10_000)
    parser.add_argument("--cells", type=int, default=CELLS)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per cell with one look")
    parser.add_argument("--looks", help="staged seeds, e.g. 3,5,8 (default: one look)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.looks:
        looks = tuple(int(x) for x in args.looks.split(","))
        rate = sequential_error(args.sweeps, looks, args.cells, args.seed)
        what = f"looks at {looks} seeds"
    else:
        rate = family_error(args.sweeps, args.cells, args.seeds, args.seed)
        what = f"{args.seeds} seeds"
    se = math.sqrt(rate * (1 - rate) / args.sweeps)
    print(f"{args.sweeps} null sweeps, {args.cells} cells + baseline, {what}: family-wise false positives "
          f"{rate:.4f} (Monte-Carlo SE {se:.4f}); alpha {ALPHA}")  # fmt: skip


if __name__ == "__main__":
    main()
