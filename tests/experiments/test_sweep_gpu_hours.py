"""A sweep's compute before it runs (experiments.sweeps.estimate): samples per optimizer step and the MFU its
GPU-hours assume, against hand computations.

A global batch is the samples of one optimizer step, accumulation included (the DataModules derive the micro-batch
or the accumulation from it), so an ``accumulate_grad_batches`` beside it must not multiply it again; without a
global batch the step is micro-batch x devices x accumulation. A finished run that measured its MFU on a GPU
(``summary.json`` ``perf.mfu``) sets the GPU-hours of every run of its network; the others keep the assumed MFU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiments.parallel.memory import setup_from_config
from experiments.sweeps.estimate import estimate, per_device_batch, resolve_config, samples_per_step
from experiments.sweeps.spec import grid, load_specs, sweep_dir_of

ROOT = Path(__file__).resolve().parents[2]
IMAGENET = 1_281_167


def vision_spec(tmp_path: Path, args: list[str]) -> Path:
    path = tmp_path / "deit.yaml"
    path.write_text(
        f"name: deit\nconfigs: [{ROOT / 'configs/vit/deit-small.yaml'}]\nschemes: [pre]\nlrs: [5.0e-4]\n"
        f"budget: {{epochs: 300}}\ndataset: {{train_images: {IMAGENET}, num_classes: 1000}}\n"
        f"runs_root: {tmp_path / 'runs'}\nargs: [{', '.join(args)}]\n"
    )
    return path


def test_a_global_batch_counts_its_accumulation_once(tmp_path: Path):
    """DeiT-S: global batch 1,024 on 8 GPUs with 2 accumulation steps is 1,024 images a step (64 per device per
    micro-batch), 300 epochs = 300 x ceil(1,281,167 / 1,024) = 375,600 steps; it was counted 2,048 a step."""
    (spec,) = load_specs(str(vision_spec(tmp_path, ["--trainer.accumulate_grad_batches=2"])))
    (run,) = grid(spec)
    est = estimate(spec, run)
    assert (est.per_step, est.steps) == (1024, 300 * math.ceil(IMAGENET / 1024)) == (1024, 375_600)
    config = resolve_config(["-c", str(ROOT / "configs/vit/deit-small.yaml"), "--trainer.accumulate_grad_batches=2"])
    assert per_device_batch(config, setup_from_config(config)) == 1024 // (8 * 2)
    micro = resolve_config(["-c", str(ROOT / "configs/vit/tiny.yaml"), "--trainer.accumulate_grad_batches=3",
                            "--trainer.devices=2"])  # fmt: skip
    assert samples_per_step(spec, micro) == 128 * 2 * 3  # no global batch: micro-batch x devices x accumulation


def test_a_finished_runs_measured_mfu_sets_its_networks_gpu_hours(tmp_path: Path):
    path = tmp_path / "lm.yaml"
    path.write_text(
        f"name: lm\nconfigs: [{ROOT / 'configs/lm/tiny.yaml'}]\nschemes: [pre, siamese]\nlrs: [1.0e-3, 2.0e-3]\n"
        f"runs_root: {tmp_path / 'runs'}\nbudget: {{steps: 1000}}\n"
        "compute: {gpu: H100 SXM, peak_tflops: 989, mfu: 0.4}\n"
    )
    (spec,) = load_specs(str(path))
    runs = grid(spec)
    assumed = {run.name(spec): estimate(spec, run) for run in runs}
    assert {e.mfu_source for e in assumed.values()} == {"assumed"} and "MFU" not in assumed["pre-lr0.001"].note
    measured = sweep_dir_of(spec) / "pre-lr0.002"
    measured.mkdir(parents=True)
    (measured / "summary.json").write_text(
        json.dumps({"status": "finished", "perf": {"mfu": 0.25, "device": "NVIDIA H100 80GB HBM3"}})
    )
    unfinished = sweep_dir_of(spec) / "siamese-lr0.001"
    unfinished.mkdir()
    (unfinished / "summary.json").write_text(json.dumps({"status": "crashed", "perf": {"mfu": 0.9}}))
    after = {run.name(spec): estimate(spec, run) for run in runs}
    for name in ("pre-lr0.001", "pre-lr0.002"):  # one network: both lrs take the measured MFU
        e = after[name]
        assert e.mfu == 0.25 and e.gpu_hours == e.train_flops / (989e12 * 0.25) / 3600
        assert e.gpu_hours == assumed[name].gpu_hours * 0.4 / 0.25
        assert "MFU 25.0% measured by pre-lr0.002 on NVIDIA H100 80GB HBM3" in e.note
    for name in ("siamese-lr0.001", "siamese-lr0.002"):  # another network; a crashed run measures nothing
        assert after[name].gpu_hours == assumed[name].gpu_hours and "MFU 40.0% assumed" in after[name].note
    from experiments.sweeps.plan import dry_run

    report, _ = dry_run([spec], memory=False)
    (grid_line,) = [line for line in report.splitlines() if line.startswith("  grid:")]
    assert "at 40% MFU (2 run(s) at their network's measured MFU) of 989 TFLOP/s" in grid_line, grid_line
