"""The memory estimate (experiments.parallel.memory): exact counts of what it must count, a real CPU fit's peak
within 15 %, and one-line errors for bad input.

The counts are computed here by hand from the network's parameter shapes, the way FSDP2 cuts them: dim 0 in
``world`` chunks of ``ceil(dim0 / world)`` rows, every rank padded to the largest chunk (rank 0 holds it). A
wrong world size, a forgotten gradient or AdamW moment, or a DDP without its bucket copy fails them.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from lightning.pytorch import Callback
from torch.distributed._tools.mem_tracker import MemTracker

from experiments.__main__ import main
from experiments.cli import main as cli_main
from experiments.parallel.memory import (
    MemorySetup,
    fake_process_group,
    measure,
    parse_memory,
    setup_from_config,
    workload_for,
)
from experiments.parallel.packed import pack_trunk
from experiments.sweeps import estimate as estimate_module
from experiments.sweeps import sweep
from experiments.sweeps.estimate import gpu_memory_of, memory_inputs, resolve_config
from fileio.checks import InputError
from models import LanguageModel, TrunkConfig

ROOT = Path(__file__).resolve().parents[2]
NETWORK = {
    "trunk": {"dim": 32, "depth": 2, "num_heads": 2, "mlp": "swiglu", "mlp_hidden": 64, "bias": False},
    "vocab_size": 256,
    "max_seq_len": 16,
    "tie_embeddings": False,
}
FP32 = 4


def packed_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes FSDP2 sees: the trunk's fused projections held as (parts, rows, in)."""
    net = LanguageModel(TrunkConfig(**NETWORK["trunk"]), 256, max_seq_len=16)
    pack_trunk(net.trunk)
    return [tuple(p.shape) for p in net.parameters()]


def shard_elements(world: int) -> int:
    """Elements of rank 0's FSDP2 shard of every parameter: ceil(dim0 / world) rows each, but a packed projection
    (parts, rows, in) is cut on its input axis (on its 2 or 3 parts, every rank would hold a padded half or third)."""
    return sum(
        s[0] * s[1] * math.ceil(s[2] / world) if len(s) == 3 else math.ceil(s[0] / world) * math.prod(s[1:])
        for s in packed_shapes()
    )


def buffer_bytes() -> int:
    net = LanguageModel(TrunkConfig(**NETWORK["trunk"]), 256, max_seq_len=16)
    return sum(b.numel() * b.element_size() for b in net.buffers())


def test_fsdp2_fp32_on_two_ranks_holds_its_shard_of_params_grads_and_two_moments():
    shapes = packed_shapes()
    shard = shard_elements(2) * FP32
    parts_cut = sum(math.ceil(s[0] / 2) * math.prod(s[1:]) for s in shapes) * FP32
    assert shard != parts_cut  # cutting qkv's 3 parts over 2 ranks would give rank 0 two of them
    setup = MemorySetup("fsdp2", world_size=2, data_parallel=2)
    est = measure(workload_for("lm", NETWORK, 4), setup, activation_checkpointing=False)
    steps = len(shapes) * FP32  # AdamW's step count: one float32 scalar per parameter
    assert est.optimizer == 2 * shard + steps  # exp_avg + exp_avg_sq, rank 0's shard
    assert est.steady == buffer_bytes() + shard + shard + 2 * shard + steps  # params + grads + moments
    assert est.params >= shard  # the sharded copy (gathered ones may be alive at the peak too)
    assert est.peak == est.params + est.grads + est.optimizer + est.activations + est.transient


def test_ddp_holds_a_full_replica_and_its_gradient_buckets():
    elements = sum(math.prod(s) for s in packed_shapes())
    setup = MemorySetup("ddp", world_size=2)
    est = measure(workload_for("lm", NETWORK, 4), setup, activation_checkpointing=False)
    steps = len(packed_shapes()) * FP32
    full = elements * FP32
    assert est.optimizer == 2 * full + steps
    assert est.steady == buffer_bytes() + full + 2 * full + 2 * full + steps  # params, grads + buckets, moments


def test_bf16_true_parameters_keep_bf16_moments():
    elements = sum(math.prod(s) for s in packed_shapes())
    setup = MemorySetup("single", precision="bf16-true")
    est = measure(workload_for("lm", NETWORK, 4), setup, activation_checkpointing=False)
    assert est.optimizer == 2 * elements * 2 + len(packed_shapes()) * FP32


def test_activation_checkpointing_lowers_the_peak():
    workload = workload_for("lm", {**NETWORK, "max_seq_len": 64}, 8)
    setup = MemorySetup("fsdp2", world_size=4, data_parallel=2, tensor_parallel=2)
    off, on = (measure(workload, setup, ac) for ac in (False, True))
    assert on.activations < off.activations
    assert on.peak < off.peak


def test_the_moe_is_estimated_with_a_balanced_capacity_and_says_so():
    network = {**NETWORK, "trunk": {**NETWORK["trunk"], "moe_experts": 4, "moe_top_k": 2, "moe_hidden": 32}}
    setup = MemorySetup("fsdp2", world_size=2, data_parallel=2, param_dtype="bfloat16")  # as on GPUs
    est = measure(workload_for("lm", network, 4), setup, False)
    assert any("MoE capacity assumed balanced (32 tokens per expert)" in n for n in est.notes)
    assert est.activations > 0


def test_the_config_says_the_strategy_mesh_and_precision():
    tiny = ["-c", str(ROOT / "configs/lm/tiny.yaml"), "--trainer.devices=8", "--trainer.accelerator=gpu"]
    setup = setup_from_config(resolve_config([*tiny, "--trainer.strategy=ddp", "--trainer.precision=bf16-mixed"]))
    assert (setup.strategy, setup.world_size, setup.precision, setup.checkpointing) == ("ddp", 8, "bf16-mixed", False)
    mp = "lightning.pytorch.strategies.ModelParallelStrategy"
    setup = setup_from_config(
        resolve_config([*tiny, "--trainer.strategy=ddp", f"--trainer.strategy={mp}", "--trainer.num_nodes=2",
                        "--trainer.strategy.init_args.data_parallel_size=8",
                        "--trainer.strategy.init_args.tensor_parallel_size=2",
                        "--model.init_args.trunk.activation_checkpointing=true"])
    )  # fmt: skip
    assert (setup.strategy, setup.world_size, setup.data_parallel, setup.tensor_parallel) == ("fsdp2", 16, 8, 2)
    assert (setup.param_dtype, setup.checkpointing) == ("bfloat16", True)  # "auto" on GPUs
    auto = setup_from_config(resolve_config([*tiny, f"--trainer.strategy={mp}", "--trainer.strategy.init_args={}"]))
    assert (auto.data_parallel, auto.tensor_parallel) == (1, 8)  # Lightning's "auto": nodes x devices per node
    fsdp1 = setup_from_config(
        resolve_config([*tiny, "--trainer.strategy=lightning.pytorch.strategies.FSDPStrategy",
                        "--trainer.strategy.init_args.activation_checkpointing_policy=[models.trunk.Block]"])
    )  # fmt: skip
    assert (fsdp1.strategy, fsdp1.data_parallel, fsdp1.checkpointing) == ("fsdp2", 8, True)
    assert "FSDP1" in fsdp1.notes[0]
    ep = setup_from_config(
        resolve_config([*tiny, f"--trainer.strategy={mp}", "--model.init_args.parallel.expert_parallel=true"])
    )
    assert "expert_parallel not estimated" in ep.notes[0]


def test_strategy_options_are_read_as_fit_reads_them(capsys):
    """``--trainer.strategy.data_parallel_size=2`` is jsonargparse's spelling of ``...init_args.data_parallel_size``:
    ``fit`` reads it so (the real parser), and so does ``estimate`` (it used to read init_args only and estimate
    the config's dp=8 layout, or refuse it)."""
    from tests.experiments.test_configs import ParseOnlyCLI

    argv = ["-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/trainer/fsdp2.yaml"),
            "--trainer.devices=4", "--trainer.strategy.data_parallel_size=2",
            "--trainer.strategy.tensor_parallel_size=2", "--model.trunk.depth=1"]  # fmt: skip
    parsed = ParseOnlyCLI(args=argv, run=False).config
    strategy = parsed.trainer.strategy.init_args
    assert (strategy.data_parallel_size, strategy.tensor_parallel_size) == (2, 2)
    assert parsed.model.init_args.trunk.depth == 1
    resolved = resolve_config(argv)
    init = resolved["trainer"]["strategy"]["init_args"]
    assert (init["data_parallel_size"], init["tensor_parallel_size"]) == (2, 2)
    assert resolved["model"]["init_args"]["trunk"]["depth"] == 1
    setup = setup_from_config(resolved)
    assert (setup.strategy, setup.world_size, setup.data_parallel, setup.tensor_parallel) == ("fsdp2", 4, 2, 2)
    main(["estimate", *argv, "--data.init_args.batch_size=2", "--data.init_args.seq_len=16"])
    assert capsys.readouterr().out.startswith("lm run: fsdp2 dp=2 tp=2 (bfloat16 all-gathers) on 4 device(s)")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--model.init_args.trunk.dim=10000000", "model.init_args.trunk.dim=10000000 must be >= 0 and <= 65536"),
        ("--model.init_args.trunk.depth=1000000", "model.init_args.trunk.depth=1000000 must be >= 0 and <= 1024"),
        ("--data.init_args.seq_len=100000000", "network max_seq_len=100000000 must be >= 0 and <= 1048576"),
        ("--data.init_args.batch_size=10000000", "per-device batch size=10000000 must be >= 0 and <= 1048576"),
    ],
)
def test_an_absurd_shape_is_refused_before_anything_is_built(option, message, capsys):
    start = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        main(["estimate", "-c", str(ROOT / "configs/lm/tiny.yaml"), option])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith("error: ") and message in err and "\n" not in err, err
    assert time.perf_counter() - start < 10  # nothing traced


def test_the_per_device_batch_follows_the_global_batch_over_the_data_parallel_ranks():
    argv = ["-c", str(ROOT / "configs/vit/deit-small.yaml")]
    workload, setup = memory_inputs(resolve_config(argv))
    assert workload.batch()[0].shape[0] == 1024 // 8
    workload, setup = memory_inputs(resolve_config([*argv, "--trainer.devices=4"]))
    assert workload.batch()[0].shape[0] == 1024 // 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu-memory", "abc"], "--gpu-memory='abc' is not a memory size (command line); valid: a positive size"),
        (["--gpu-memory=-80GB"], "--gpu-memory='-80GB' is not a memory size"),
        (["--gpu_memory", "80GB"], "estimate does not take '--gpu_memory' (command line); valid: -c CONFIG"),
        (["--trainer.devices=0"], "world size trainer.devices x trainer.num_nodes = 0 x 1 = 0 (config)"),
        (["--trainer.precision=fp8"], "trainer.precision='fp8' (config) is not estimated; valid: 32-true"),
        (["--trainer.strategy=deepspeed"], "trainer.strategy='deepspeed' (config) is not estimated"),
        (
            [
                "--trainer.strategy=lightning.pytorch.strategies.ModelParallelStrategy",
                "--trainer.strategy.init_args.data_parallel_size=3",
                "--trainer.strategy.init_args.tensor_parallel_size=1",
            ],
            "data_parallel_size x tensor_parallel_size = 3 x 1 = 3 (config) is not the world size",
        ),  # fmt: skip
    ],
)
def test_bad_input_is_one_line_with_exit_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["estimate", "-c", str(ROOT / "configs/lm/tiny.yaml"), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err, err


def test_a_config_that_does_not_parse_is_named(tmp_path, capsys):
    for text, message in (("a: [", "is not valid YAML"), ("- 1\n- 2\n", "holds a YAML list, not a mapping")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(SystemExit) as stop:
            main(["estimate", "-c", str(bad)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert f"-c {bad} {message}" in err and "\n" not in err, err
    with pytest.raises(SystemExit):
        main(["estimate", "--trainer.devices=8"])
    assert "no config given" in capsys.readouterr().err


def test_gpu_memory_units():
    assert parse_memory("80GB") == 80 * 10**9
    assert parse_memory("141 GB") == 141 * 10**9
    assert parse_memory("96GiB") == 96 * 2**30
    assert parse_memory("80") == 80 * 10**9
    with pytest.raises(InputError):
        parse_memory("0GB")


def test_a_process_group_already_there_is_left_alone():
    with fake_process_group(2), pytest.raises(RuntimeError, match="already initialized"), fake_process_group(2):
        pass


@pytest.mark.slow  # three tiny LMs measured (seconds each)
def test_the_dry_run_shows_each_runs_peak_per_gpu(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(estimate_module, "cuda_here", lambda: True)  # a GPU machine: the local runs train there
    sweep.main(["sweep", "configs/sweeps/lm-tiny.yaml", "--dry-run"])
    out = capsys.readouterr().out
    assert "memory: peak/GPU of one training step vs 80.00 GB (H100: 80 GB)" in out
    rows = re.findall(r"^\s+\d+\s+(pre|post|siamese)\s.*\s([\d.]+) MB ok  ", out, re.MULTILINE)
    assert [name for name, _ in rows] == ["pre", "post", "siamese"]
    assert float(rows[2][1]) > float(rows[0][1])  # two residual streams hold more than one


def test_gpu_memory_of_a_spec_names_the_size():
    assert gpu_memory_of("H100 SXM, bf16 dense") == (80 * 10**9, "H100: 80 GB")
    assert gpu_memory_of("A100 40GB")[0] == 40 * 10**9
    assert gpu_memory_of("H200")[0] == 141 * 10**9
    assert "assumed" in gpu_memory_of("TPU v5")[1]


# ------------------------------------------------------------------------------------ against a real CPU fit

TINY_FIT = [
    "-c", str(ROOT / "configs/lm/tiny.yaml"),
    "--model.init_args.trunk.dim=64", "--model.init_args.trunk.depth=2", "--model.init_args.trunk.num_heads=2",
    "--model.init_args.trunk.mlp_hidden=128", "--data.init_args.seq_len=128", "--data.init_args.batch_size=16",
    "--data.init_args.eval_samples=16",
]  # fmt: skip


class PeakProbe(Callback):
    """Watches a real fit's training steps with torch's MemTracker (real tensors on CPU) and keeps the peak."""

    peaks: ClassVar[list[int]] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.tracker = MemTracker()
        self.tracker.track_external(pl_module, *trainer.optimizers)
        self.tracker.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.tracker.reset_mod_stats()  # per-module records only: the peak is kept

    def on_train_end(self, trainer, pl_module) -> None:
        self.tracker.__exit__(None, None, None)
        PeakProbe.peaks.append(int(self.tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]))


@pytest.mark.slow
def test_the_estimate_is_within_15_percent_of_a_real_cpu_fits_peak(tmp_path):
    PeakProbe.peaks.clear()
    cli_main(
        ["fit", *TINY_FIT, f"--runs_root={tmp_path}", f"--data.init_args.data_dir={tmp_path / 'data'}",
         "--trainer.max_steps=3", "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=0",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--trainer.callbacks+=tests.experiments.test_memory_estimate.PeakProbe"]
    )  # fmt: skip
    (measured,) = PeakProbe.peaks
    workload, setup = memory_inputs(resolve_config(TINY_FIT))
    est = measure(workload, setup, activation_checkpointing=setup.checkpointing)
    print(f"estimate {est.peak:,} B, measured {measured:,} B, ratio {est.peak / measured:.3f}")
    assert abs(est.peak / measured - 1) < 0.15, (est.peak, measured)
