"""``--scaling --schemes pre,<scheme>,...``: the scaling sweep's rows for any scheme against ``pre`` (mHC's cost as
width grows), one table and one target pair per scheme; ``all`` (the default) keeps SiameseNorm's sweep."""

from __future__ import annotations

import experiments.bench as bench
from experiments.bench.scaling import scaling_candidates, scaling_markdown
from models.schemes import NormScheme


def test_candidates_are_the_schemes_given_besides_pre():
    assert scaling_candidates(["pre", "mhc"]) == ("mhc",)
    assert scaling_candidates(["pre", "mhc", "siamese"]) == ("mhc", "siamese")
    assert scaling_candidates([s.value for s in NormScheme]) == ("siamese",)  # --schemes all
    assert scaling_candidates(["pre"]) == ("siamese",)


def test_one_table_and_targets_per_candidate():
    def row(dim: int, step: float, cand: str) -> bench.ScalingRow:
        return bench.ScalingRow("width", dim, 2, 2, 1, 1.0, step, step, 1.0, 1.1, 0.1, 0.2, cand)

    rows = [row(128, 2.3, "mhc"), row(128, 1.2, "siamese"), row(1024, 1.4, "mhc"), row(1024, 1.05, "siamese")]
    text = scaling_markdown(rows, {"command": "x"})
    assert "| mhc/pre step |" in text and "| siamese/pre step |" in text
    assert text.count("| axis |") == 2
    goals = bench.scaling_targets(rows)
    mhc = next(g for g in goals if g.what.startswith("scaling: mhc/pre step time"))
    assert abs(mhc.value - 0.4 / 1.3) < 1e-12 and mhc.met
