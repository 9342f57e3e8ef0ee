"""compare reads each run's final weights on the whole validation split (summary.json ``whole_split_val``) when every
validated run has it, and the last in-loop validation of every run otherwise: a cell never pairs the two."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.results import compare
from tests.experiments.test_compare import PRE, SIAMESE, seeded, write_sweep

WHOLE_PRE, WHOLE_SIAMESE = [1.601, 1.622, 1.590], [1.641, 1.660, 1.629]  # the whole split reverses the order


def _with_whole(runs, values):
    pairs = zip(runs, values, strict=True)
    return [(coords, record | {"whole_split_val": {"val/loss": v}}) for (coords, record), v in pairs]


def _values(root: Path) -> dict[str, float]:
    comparison = compare.load_comparison(root)
    return {row["run"]: row[compare.PRIMARY] for row in comparison.table}


def test_the_whole_split_is_compared_when_every_run_has_it(tmp_path: Path):
    root = write_sweep(tmp_path / "s", _with_whole(seeded("pre", PRE), WHOLE_PRE)
                       + _with_whole(seeded("siamese", SIAMESE), WHOLE_SIAMESE))  # fmt: skip
    assert _values(root) == {
        **{f"pre-s{i}": v for i, v in zip((1, 2, 3), WHOLE_PRE, strict=True)},
        **{f"siamese-s{i}": v for i, v in zip((1, 2, 3), WHOLE_SIAMESE, strict=True)},
    }
    assert "whole validation split" in compare.load_comparison(root).markdown()


def test_one_run_without_it_and_every_run_is_read_at_its_last_in_loop_validation(tmp_path: Path):
    runs = _with_whole(seeded("pre", PRE), WHOLE_PRE) + _with_whole(seeded("siamese", SIAMESE), WHOLE_SIAMESE)
    root = write_sweep(tmp_path / "s", runs)
    summary = root / "siamese-s3" / "summary.json"
    record = json.loads(summary.read_text())
    del record["whole_split_val"]
    summary.write_text(json.dumps(record))
    assert _values(root) == {
        **{f"pre-s{i}": v for i, v in zip((1, 2, 3), PRE, strict=True)},
        **{f"siamese-s{i}": v for i, v in zip((1, 2, 3), SIAMESE, strict=True)},
    }
    assert "1 of 6 runs have no whole-split validation" in compare.load_comparison(root).markdown()
