"""``bench --training-step``: each scheme's task module eager and compiled through training's compile path, timed
interleaved; the ratios in the report are recomputed here from the raw times its JSON keeps, and the compiled
modules must have compiled (dynamo graphs) while the eager ones did not."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from scipy.stats import binom

from experiments import bench
from experiments.bench.training_report import TRAINING_COLUMNS
from experiments.bench.training_step import interval_coverage, median_interval


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # the CLI sets 1 thread on CPU; leave the session as it was


def test_training_step_ratios_are_the_raw_times_of_compiled_modules_over_pre(tmp_path: Path):
    out = tmp_path / "out"
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    # post first: a ratio taken against the first scheme instead of pre would differ from 1 for pre
    argv = ["--training-step", "--task", "lm", "--size", "micro", "--schemes", "post,pre", "--steps", "3",
            "--warmup", "1", "--compile-backend", "eager", "--out", str(out)]  # fmt: skip
    bench.main(argv)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > before  # dynamo really ran
    record = json.loads((out / "training_step.json").read_text())
    (run,) = record["runs"]
    raw = {(c["scheme"], c["mode"]): c for c in run["candidates"]}
    assert sorted(raw) == [(s, m) for s in ("post", "pre") for m in ("compiled", "eager")]
    with open(out / "training_step.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == TRAINING_COLUMNS
        rows = {(r["scheme"], r["mode"]): r for r in reader}
    assert rows.keys() == raw.keys()
    for (scheme, mode), r in rows.items():
        times, graphs = raw[(scheme, mode)]["times_s"], raw[(scheme, mode)]["graphs_per_step"]
        assert len(times) == 3 and len(graphs) == 4  # the warm-up step is not timed
        assert float(r["step_ms"]) == pytest.approx(1e3 * statistics.median(times), rel=1e-12)
        per_round = [t / p for t, p in zip(times, raw[("pre", mode)]["times_s"], strict=True)]
        assert float(r["ratio"]) == pytest.approx(statistics.median(per_round), rel=1e-12)
        assert (float(r["ratio_low"]), float(r["ratio_high"])) == pytest.approx((min(per_round), max(per_round)))
        assert r["baseline"] == "pre" and int(r["graphs"]) == sum(graphs)
        if mode == "compiled":  # compiled in the warm-up step, never again while timed
            assert r["compiled"] == "True" and graphs[0] > 0 and sum(graphs[1:]) == 0 and r["timed_graphs"] == "0"
            eager = raw[(scheme, "eager")]["times_s"]
            vs_eager = statistics.median(t / e for t, e in zip(times, eager, strict=True))
            assert float(r["vs_eager"]) == pytest.approx(vs_eager, rel=1e-12)
        else:
            assert r["compiled"] == "False" and sum(graphs) == 0 and math.isnan(float(r["vs_eager"]))
    assert float(rows[("pre", "compiled")]["ratio"]) == 1.0 == float(rows[("pre", "eager")]["ratio"])
    assert [r["vs_eager"] for r in record["rows"] if r["mode"] == "eager"] == [None, None]  # JSON: null, not NaN
    text = (out / "training_step.md").read_text()
    assert "python -m experiments bench --training-step --task lm --size micro --schemes post,pre" in text
    assert "- device: cpu" in text and "backend eager" in text
    assert "| post | " in text and "compiled ratio to pre" in text and "NOT COMPILED" not in text


@pytest.mark.parametrize("n", range(1, 41))
def test_median_interval_is_the_binomial_order_statistic(n: int):
    """Against scipy's binomial: the widest-trimmed [x_(k), x_(n+1-k)] covering the median with >= 95 %."""
    ks = [k for k in range(1, (n + 1) // 2 + 1) if 1 - 2 * binom.cdf(k - 1, n, 0.5) >= 0.95]
    k = max(ks, default=1)
    values = [float(v * v) for v in range(n, 0, -1)]  # unsorted on purpose
    ordered = sorted(values)
    assert median_interval(values) == (ordered[k - 1], ordered[n - k])
    assert interval_coverage(n) == pytest.approx(1 - 2 * binom.cdf(k - 1, n, 0.5), abs=1e-12)
