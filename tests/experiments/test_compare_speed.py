"""``compare``'s speed table (``speed.md`` / ``speed.csv``): throughput, peak memory, MFU and GPU-hours per cell from
the runs' ``summary.json`` ``perf``, and the throughput ratio against the baseline paired by seed, with references
computed here with scipy; malformed records skipped and named, never a crash."""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from experiments.results import export
from tests.experiments.test_compare import cells_table, summary, write_sweep
from tests.experiments.test_compare_reading import compare_tables, set_record

CPU = "cpu"
CONVENTION = "6N + 12LdT per token (attention full; mfu_causal: 6N + 6LdT)"


def perf(tokens: float | None, mfu: object = "n/a", devices: int = 1, device: str = CPU, mem: float = 1.5, **extra):
    """A ``perf`` block as a run records it (tokens/s = 128 x samples/s, the tiny LM's window)."""
    block = {"samples_per_s": (tokens or 1280.0) / 128, "peak_mem_gb": mem, "mfu": mfu, "devices": devices,
             "device": device, "peak_flops_per_device": "n/a", "tokens_per_sample": 128,
             "flop_convention": CONVENTION}  # fmt: skip
    if tokens is not None:
        block["tokens_per_s"] = tokens
    return block | extra


def run(scheme: str, seed: int, lr: float, block: object, wall: float = 900.0, task: str = "lm"):
    """A run of the grid (coordinates, summary); ``block`` None: a summary from before runs recorded speed."""
    record = summary(scheme, lr, "finished", 1.5) | {"wall_time_s": wall, "task": task}
    if block is not None:
        record["perf"] = block
    return {"name": f"{scheme}-lr{lr:g}-s{seed}", "scheme": scheme, "seed": seed, "lr": lr}, record


RATIO, MFU, HOURS, RECORDED = "tokens/s ratio vs pre (95 % CI)", "MFU (mean)", "GPU-hours", "speed recorded"
RATE, SD, MEMORY = "tokens/s (mean ± 95 % CI)", "tokens/s SD", "peak memory GB (max)"


def speed_outputs(sweep_dir: Path, capsys) -> tuple[list[dict], list[dict], str]:
    """``compare DIR --tables-only`` in-process: speed.md's table rows ({column: text}, the header as row 0),
    speed.csv's rows, and speed.md."""
    compare_tables(sweep_dir, capsys)
    text = (sweep_dir / "speed.md").read_text()
    rows = cells_table(text)
    table = [dict(zip(rows[0], row, strict=True)) for row in [rows[0], *rows[2:]]]
    return table, list(csv.DictReader(io.StringIO((sweep_dir / "speed.csv").read_text()))), text


def log_ratio_reference(values: dict, base: dict) -> tuple[float, float, float]:
    """The paired geometric-mean ratio and its 95 % t-interval, from scipy, over the seeds both have."""
    logs = [math.log(values[s] / base[s]) for s in values if s in base]
    mean, half = statistics.fmean(logs), scipy_stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs)
    half /= math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


# Eight GPUs per run. siamese's seed 2 measured no MFU; at lr 0.02 everything runs twice as fast, so a ratio that
# paired across learning rates (or by position: siamese's runs are listed s3, s1, s2) would be far off.
PRE = {1: 100_000.0, 2: 120_000.0, 3: 110_000.0}
SIAMESE = {1: 90_000.0, 2: 115_000.0, 3: 93_500.0}
PRE_MFU, SIAMESE_MFU = {1: 0.40, 2: 0.42, 3: 0.47}, {1: 0.36, 2: "n/a", 3: 0.38}
H100 = "NVIDIA H100 80GB HBM3"


def gpu_sweep(root: Path) -> Path:
    runs = []
    for lr, scale in ((0.01, 1.0), (0.02, 2.0)):
        runs += [run("pre", s, lr, perf(PRE[s] * scale, PRE_MFU[s], 8, H100, mem=60.0 + s)) for s in (1, 2, 3)]
        runs += [run("siamese", s, lr, perf(SIAMESE[s] * scale, SIAMESE_MFU[s], 8, H100, mem=70.0 + s), wall=1800.0)
                 for s in (3, 1, 2)]  # fmt: skip
    return write_sweep(root, runs)


def test_the_speed_table_shows_throughput_mfu_gpu_hours_and_the_paired_ratio(tmp_path: Path, capsys):
    rows, csv_rows, text = speed_outputs(gpu_sweep(tmp_path), capsys)
    assert list(rows[0]) == ["scheme", "lr", RATE, SD, MEMORY, MFU, HOURS, RATIO, RECORDED]
    pre, siamese = rows[1], rows[2]
    assert [(r["scheme"], r["lr"]) for r in rows[1:]] == [("pre", "0.01"), ("siamese", "0.01"), ("pre", "0.02"),
                                                          ("siamese", "0.02")]  # fmt: skip
    # the throughput's mean and interval: scipy's t-interval over the three seeds
    low, high = scipy_stats.t.interval(0.95, 2, loc=statistics.fmean(PRE.values()),
                                       scale=statistics.stdev(PRE.values()) / math.sqrt(3))  # fmt: skip
    assert float(csv_rows[0]["mean"]) == pytest.approx(110_000.0, rel=1e-12)
    assert float(csv_rows[0]["ci_low"]) == pytest.approx(low, rel=1e-12)
    assert float(csv_rows[0]["ci_high"]) == pytest.approx(high, rel=1e-12)
    assert float(csv_rows[0]["std"]) == pytest.approx(10_000.0, rel=1e-12) and pre[SD] == "10000"
    assert pre[RATE] == f"110000 ± {(high - low) / 2:.0f} (n = 3)"
    # peak memory: the largest; MFU: the mean of the measured ones; GPU-hours: wall x devices / 3600, summed
    assert pre[MEMORY] == "63" and siamese[MEMORY] == "73"
    assert pre[MFU] == "43.0%" and siamese[MFU] == "37.0% (2 of 3 runs)"
    assert pre[HOURS] == "6" and siamese[HOURS] == "12"  # 3 x 900 s x 8 / 3600; 3 x 1800 s x 8 / 3600
    assert float(csv_rows[1]["gpu_hours"]) == pytest.approx(12.0, rel=1e-12) and csv_rows[1]["mfu_runs"] == "2"
    # the ratio against pre at the same lr, paired by seed: scipy's t-interval of the mean log ratio
    ratio, r_low, r_high = log_ratio_reference(SIAMESE, PRE)
    assert pre[RATIO] == "(baseline)" and siamese[RATIO] == f"{ratio:.3f} ({r_low:.3f} to {r_high:.3f}, n = 3)"
    for row in csv_rows[1], csv_rows[3]:  # lr 0.02 (both twice as fast): the same ratios
        assert float(row["ratio"]) == pytest.approx(ratio, rel=1e-12)
        assert float(row["ratio_ci_low"]) == pytest.approx(r_low, rel=1e-12)
        assert float(row["ratio_ci_high"]) == pytest.approx(r_high, rel=1e-12)
    assert siamese[RECORDED] == "3 of 3 runs"
    assert CONVENTION in text and "wall_time_s x devices / 3600" in text
    assert "**How many runs shared the host is not recorded: speed measured under load: compare only runs" in text


def test_one_pair_is_a_ratio_without_an_interval(tmp_path: Path, capsys):
    sweep = write_sweep(tmp_path, [run("pre", 1, 0.01, perf(1000.0)), run("siamese", 1, 0.01, perf(800.0))])
    rows, csv_rows, _ = speed_outputs(sweep, capsys)
    assert rows[2][RATIO] == "0.800 (n = 1)" and csv_rows[1]["ratio_ci_low"] == ""


def test_gpu_hours_say_when_a_run_recorded_no_wall_time(tmp_path: Path, capsys):
    runs = [run("pre", 1, 0.01, perf(1000.0, 0.3, 4, H100), wall=None), run("pre", 2, 0.01, perf(1000.0, 0.3, 4, H100))]
    rows, csv_rows, _ = speed_outputs(write_sweep(tmp_path, runs), capsys)
    assert rows[1][HOURS] == "1 (1 of 2 runs)"  # 900 s x 4 devices / 3600


def test_cpu_runs_say_na_and_runs_without_speed_are_a_dash(tmp_path: Path, capsys):
    runs = [run("pre", s, 0.01, perf(1000.0 + s)) for s in (1, 2)]
    runs += [run("siamese", s, 0.01, None) for s in (1, 2)]  # summaries from before runs recorded their speed
    sweep = write_sweep(tmp_path, runs)
    rows, csv_rows, text = speed_outputs(sweep, capsys)
    assert (rows[1][MFU], rows[1][HOURS]) == ("n/a (cpu)", "n/a (cpu)")
    assert float(csv_rows[0]["device_hours"]) == pytest.approx(2 * 900 / 3600, rel=1e-12)
    assert csv_rows[0]["gpu_hours"] == "" and csv_rows[0]["mfu"] == ""
    assert list(rows[2].values())[1:] == ["-"] * 6 + ["0 of 2 runs"]
    assert "2 run(s) recorded no speed (summary.json without perf" in text


def test_images_are_counted_in_samples(tmp_path: Path, capsys):
    runs = [run(scheme, s, 0.01, perf(None), task="vit") for scheme in ("pre", "siamese") for s in (1, 2)]
    rows, csv_rows, _ = speed_outputs(write_sweep(tmp_path, runs), capsys)
    assert "samples/s (mean ± 95 % CI)" in rows[0] and rows[2]["samples/s ratio vs pre (95 % CI)"] == (
        "1.000 (1.000 to 1.000, n = 2)"
    )
    assert float(csv_rows[0]["mean"]) == pytest.approx(10.0, rel=1e-12) and csv_rows[0]["unit"] == "samples/s"


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"mfu": 1.7}, "pre-lr0.01-s1: perf.mfu=1.7"),
        ({"mfu": 0.0}, "pre-lr0.01-s1: perf.mfu=0.0"),
        ({"mfu": "high"}, "pre-lr0.01-s1: perf.mfu='high'"),
        ({"tokens_per_s": "fast"}, "pre-lr0.01-s1: perf.tokens_per_s='fast'"),
        ({"samples_per_s": -3.0}, "pre-lr0.01-s1: perf.samples_per_s=-3.0"),
        ({"peak_mem_gb": -1.0}, "pre-lr0.01-s1: perf.peak_mem_gb=-1.0"),
        ({"devices": True}, "pre-lr0.01-s1: perf.devices=True"),
        ({"devices": 0}, "pre-lr0.01-s1: perf.devices=0"),
        ({"tokens_per_s": float("inf")}, "pre-lr0.01-s1: perf.tokens_per_s=inf"),
        ([1, 2], "pre-lr0.01-s1: perf is a list"),
    ],
)
def test_a_malformed_speed_record_is_skipped_and_named(tmp_path: Path, capsys, bad, named):
    block = perf(2000.0, 0.5, 1, H100) | bad if isinstance(bad, dict) else bad
    runs = [run("pre", 1, 0.01, block), run("pre", 2, 0.01, perf(1000.0, 0.5, 1, H100))]
    runs += [run("siamese", s, 0.01, perf(900.0, 0.5, 1, H100)) for s in (1, 2)]
    rows, csv_rows, text = speed_outputs(write_sweep(tmp_path, runs), capsys)  # exit 0: nothing crashes
    assert f"Speed records skipped (not a positive number, a negative memory, an MFU outside (0, 1], or not a " \
           f"mapping): {named}." in text  # fmt: skip
    assert rows[1][RATE] == "1000 (n = 1)" and rows[1][RECORDED] == "1 of 2 runs"  # the good run alone
    assert rows[2][RATIO] == "0.900 (n = 1)"  # the one pair left (seed 2)


def test_the_note_says_whether_runs_shared_the_host(tmp_path: Path, capsys):
    sweep = write_sweep(tmp_path, [run("pre", 1, 0.01, perf(1000.0)), run("siamese", 1, 0.01, perf(800.0))])
    set_record(sweep, parallel=2)
    text = speed_outputs(sweep, capsys)[2]
    assert "**The sweep ran 2 runs at a time (sweep.yaml parallel: 2): speed measured under load: compare only " \
           "runs measured side by side**" in text  # fmt: skip
    set_record(sweep, parallel=1)
    text = speed_outputs(sweep, capsys)[2]
    assert "The sweep ran one run at a time (sweep.yaml parallel: 1)" in text and "under load" not in text


def test_the_export_carries_the_speed_table_and_a_sweep_without_speed_gets_none(tmp_path: Path, capsys):
    sweep = gpu_sweep(tmp_path / "gpu")
    compare_tables(sweep, capsys)
    written = export.export(sweep, tmp_path / "exported")
    for name in ("speed.md", "speed.csv"):
        assert tmp_path / "exported" / name in written
        assert (tmp_path / "exported" / name).read_text() == (sweep / name).read_text()
    old = write_sweep(tmp_path / "old", [run("pre", 1, 0.01, None), run("siamese", 1, 0.01, None)])
    compare_tables(old, capsys)
    assert not (old / "speed.md").exists() and not (old / "speed.csv").exists()
