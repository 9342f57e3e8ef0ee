"""Every run of every shipped sweep spec parses with the real CLI and builds on the meta device; the compute
estimate agrees with what the CLI builds; the paper's Table 1 is 30 jobs with their compute."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from experiments.sweeps import estimate as estimate_module
from experiments.sweeps import sweep
from experiments.sweeps.estimate import estimate, resolve_config, run_extra_args
from experiments.sweeps.spec import grid, load_specs
from models import TrunkConfig, count_params
from models.dit import DiT
from models.lm import LanguageModel
from models.vit import ViTClassifier
from tests.experiments.test_configs import ParseOnlyCLI

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs/sweeps").glob("*.yaml"))


@pytest.fixture(scope="session")
def parser():
    """The suite's own CLI parser, built once (building it is what costs; parsing a run is cheap)."""
    return ParseOnlyCLI(args=["-c", str(ROOT / "configs/lm/tiny.yaml")], run=False).parser


def params_on_meta(config, dataset: dict, active: bool) -> int:
    """Parameters of the run's network built on the meta device from the CLI-parsed config (cached per shape:
    runs that differ in lr or seed share their network)."""
    init, data = config.model.init_args, config.data.init_args
    trunk = TrunkConfig(**init.trunk).to_dict()
    key = json.dumps([config.model.class_path, trunk, str(data), str(init.get("patch_size")), dataset, active])
    if key not in _PARAMS:
        _PARAMS[key] = count_params(build_on_meta(config, dataset), active=active)
    return _PARAMS[key]


_PARAMS: dict[str, int] = {}


def build_on_meta(config, dataset: dict) -> torch.nn.Module:
    """The run's network from the CLI-parsed config, on the meta device (what the task module would build)."""
    init, data = config.model.init_args, config.data.init_args
    trunk = TrunkConfig(**init.trunk)
    task = config.model.class_path.rsplit(".", 1)[-1]
    with torch.device("meta"):
        if task == "LanguageModeling":
            vocab = 256 if data.tokenizer == "byte" else data.bpe_vocab_size
            return LanguageModel(trunk, vocab, data.seq_len, tie_embeddings=init.tie_embeddings)
        if task == "ImageClassification":
            classes = dataset.get(
                "num_classes", 10 if config.data.class_path.endswith("EmbeddedImageDataModule") else 1000
            )
            return ViTClassifier(trunk, data.image_size, init.patch_size, 3, classes)
        return DiT(trunk, dataset.get("latent_size", 32), init.patch_size, dataset.get("latent_channels", 4),
                   dataset.get("num_classes", 1000), learn_sigma=init.learn_sigma)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS)
def test_every_run_of_every_shipped_spec_builds_on_the_meta_device(path: str, parser, monkeypatch):
    monkeypatch.chdir(ROOT)
    # what only a seed or the learning rate changes (the rate's way into the config is checked on the first one)
    same_network = ("--run_name=", "--seed_everything=", "--data.init_args.seed=", "--model.init_args.optim.lr=")
    for spec in load_specs(path):
        checked: dict[tuple[str, ...], int] = {}  # a run's argv without its seed and lr -> the parameters it builds
        for run in grid(spec):
            argv = run.argv(spec, extra=run_extra_args(spec, run))[4:]
            est = estimate(spec, run)
            network = tuple(a for a in argv if not a.startswith(same_network))
            if network in checked:  # another seed or lr of a run parsed and built below: the same network
                assert est.params == checked[network], f"{path} {run.name(spec)}: a seed or lr changed the network"
                continue
            config = parser.parse_args(argv)  # every key of every config, overlay and argument, as `fit` reads them
            checked[network] = est.params
            assert est.params == params_on_meta(config, spec.dataset, active=est.task == "lm"), (
                f"{path} {run.name(spec)}: the estimate resolved another network"
            )
            assert config.model.init_args.trunk.norm_scheme == run.scheme.split("-")[0]
            if run.lr is not None:
                assert config.model.init_args.optim.lr == run.lr
            if config.trainer.max_steps and config.trainer.max_steps > 0:
                assert est.steps == config.trainer.max_steps
            merged = resolve_config(argv)  # the sweep's own merge agrees with the CLI on what it reads
            assert str(merged["trainer"].get("devices")) == str(config.trainer.devices)


def test_paper_table1_dry_run_lists_30_jobs_with_their_compute(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    sweep.main(["sweep", "configs/sweeps/paper-table1.yaml", "--dry-run", "--no-memory"])  # memory: minutes
    out = capsys.readouterr().out
    assert "sweep paper-table1 (configs/sweeps/paper-table1.yaml): 30 jobs" in out
    steps = math.ceil(1e11 / (2048 * 2048))  # 100B tokens at the config's global batch, 2,048 x 2,048 tokens
    rows = re.findall(rf"^\s+\d+\s+(\S+-lr\S+)\s+1\.28B\s+{steps:,}\s+100B\s+(\S+)\s+(\S+)", out, re.MULTILINE)
    assert len(rows) == 30 and len({name for name, *_ in rows}) == 30
    flops = float(rows[0][1])  # 6 N D with N the non-embedding parameters (~1.18B)
    assert 6 * 1.17e9 * 1e11 < flops < 6 * 1.19e9 * 1e11
    hours = flops / (989e12 * 0.40) / 3600
    assert rows[0][2] == f"{hours:,.0f}"
    assert re.search(r"grid: 30 runs, \S+ FLOPs, [\d,]+ GPU-hours at 40% MFU of 989 TFLOP/s per GPU", out)
    assert "#SBATCH --signal=SIGUSR1@300" in out and "#SBATCH --array=0-29%30" in out
    assert "peak/GPU" not in out


def test_the_dry_run_gives_every_run_its_peak_per_gpu(monkeypatch, capsys):
    """On a machine with CUDA the demo's runs (accelerator auto, local launcher) train on the GPU: each gets its
    peak; on this CPU-only machine they train on CPU: no GPU memory is measured (as fast as --no-memory)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(estimate_module, "cuda_here", lambda: True)
    sweep.main(["sweep", "configs/sweeps/demo.yaml", "--dry-run"])  # 3 tiny LMs: seconds on fake tensors
    out = capsys.readouterr().out
    assert re.search(r"memory: peak/GPU of one training step vs [\d.]+ GB", out)
    assert len(re.findall(r"\s[\d.]+ [kMG]?B ok", out)) == 3
    monkeypatch.undo()
    monkeypatch.chdir(ROOT)
    measured = estimate_module._memory_cached.cache_info().misses
    sweep.main(["sweep", "configs/sweeps/demo.yaml", "--dry-run"])
    out = capsys.readouterr().out
    assert estimate_module._memory_cached.cache_info().misses == measured  # nothing measured
    assert (
        len(
            re.findall(
                r"\s+cpu  .*runs on CPU \(trainer.accelerator=auto, run locally on a machine without CUDA\)", out
            )
        )
        == 3
    )


def test_a_dry_run_lists_every_run_when_one_network_fails(monkeypatch, capsys, tmp_path: Path):
    """A network whose step raises (as Hyper-Connections did with bfloat16 parameters) is one ``error:`` line
    naming its runs and the cause, exit 2; the other runs keep their peak; no traceback, no ``[rank0]:`` prefix
    (every fake process group used to wrap sys.excepthook in one more prefixer)."""
    import sys

    from experiments.__main__ import main
    from models.schemes.hyper import HyperConnections

    def broken(self, streams):
        raise RuntimeError("expected scalar type Float but found BFloat16")

    monkeypatch.setattr(HyperConnections, "prepare", broken)
    spec = tmp_path / "mixed.yaml"
    spec.write_text(
        f"name: mixed\nconfigs: [{ROOT / 'configs/lm/tiny.yaml'}]\nschemes: [pre, hyper]\nlrs: [1.0e-3, 2.0e-3]\n"
        "args: [--trainer.accelerator=gpu, --model.init_args.trunk.depth=2, --model.init_args.trunk.dim=64]\n"
    )
    hook = sys.excepthook
    with pytest.raises(SystemExit) as stop:
        main(["sweep", str(spec), "--dry-run"])
    assert stop.value.code == 2 and sys.excepthook is hook
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert errors == [
        "error: estimate of 2 run(s) failed (mixed/hyper-lr0.001, mixed/hyper-lr0.002): memory estimate failed: "
        "RuntimeError: expected scalar type Float but found BFloat16"
    ]
    assert len(re.findall(r"^\s+\d+\s+pre-lr\S+\s.*\s[\d.]+ MB ok", captured.out, re.MULTILINE)) == 2
    assert (
        len(re.findall(r"^\s+\d+\s+hyper-lr\S+\s.*\serror  .*; error: memory estimate", captured.out, re.MULTILINE))
        == 2
    )
    assert "Traceback" not in captured.out + captured.err and "[rank" not in captured.out + captured.err


def test_a_budget_on_the_command_line_overrides_the_spec(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    argv = ["configs/sweeps/paper-depth.yaml", "--dry-run", "--no-memory", "--budget", "steps=1000", "--commands"]
    sweep.main(["sweep", *argv])
    out = capsys.readouterr().out
    assert out.count("--trainer.max_steps=1000") == 8 and "budget: steps 1,000 -> 1,000 steps" in out


def test_a_dry_run_refuses_an_absurd_depth_in_its_row(tmp_path: Path, capsys):
    """A depth past the estimate's limit is that run's error (one line, exit 2), found before anything is built."""
    from experiments.__main__ import main

    spec = tmp_path / "absurd.yaml"
    spec.write_text(
        f"name: absurd\nconfigs: [{ROOT / 'configs/lm/tiny.yaml'}]\nschemes: [pre]\n"
        "args: [--model.init_args.trunk.depth=1000000]\n"
    )
    with pytest.raises(SystemExit) as stop:
        main(["sweep", str(spec), "--dry-run"])
    captured = capsys.readouterr()
    assert stop.value.code == 2 and "absurd (" in captured.out
    assert captured.err.strip().splitlines() == [
        "error: estimate of 1 run(s) failed (absurd/pre): model.init_args.trunk.depth=1000000 must be >= 0 and <= "
        "1024 (config; the memory estimate's limit)"
    ]
