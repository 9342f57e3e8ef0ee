"""The language-modeling task end to end through the real CLI, on the embedded corpus (tiny sizes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from experiments.cli import SaveConfigCallback, SuiteCLI, main
from models.schemes import NormScheme
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
TINY = tiny_lm(quiet=False)  # each run says itself whether it shows the progress bar


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("text")


def run(sub: str, runs: Path, data_dir: Path, *extra: str, scheme: str = "pre") -> None:
    main(
        [
            sub,
            "-c", str(ROOT / "configs/lm/tiny.yaml"),
            "-c", str(ROOT / f"configs/norm/{scheme}.yaml"),
            f"--runs_root={runs}",
            f"--trainer.default_root_dir={runs}",  # fast_dev_run has no logger: keep checkpoints here
            f"--data.init_args.data_dir={data_dir}",
            "--trainer.enable_progress_bar=false",
            *TINY,
            *extra,
        ]
    )  # fmt: skip


@pytest.mark.parametrize("scheme", [s.value for s in NormScheme])
def test_fast_dev_run_every_scheme(scheme: str, tmp_path: Path, data_dir: Path):
    run("fit", tmp_path, data_dir, "--trainer.fast_dev_run=2", scheme=scheme)
    summary = _summary(tmp_path, scheme)
    assert (summary["status"], summary["steps"], summary["scheme"]) == ("finished", 2, scheme)
    assert math.isfinite(summary["final_val"]["val/loss"]) and summary["final_val"]["val/loss"] > 0
    assert (tmp_path / "lm" / "tiny" / scheme / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("cell", ["pre-dyt-llama", "siamese-dyt-llama"])
def test_fast_dev_run_dyt_as_its_llama_port_trains_it(cell: str, tmp_path: Path, data_dir: Path):
    """The sweep cells of DyT over Pre-Norm and over SiameseNorm (per-site alpha, no shift, embedding scale)."""
    run("fit", tmp_path, data_dir, "--trainer.fast_dev_run=2", scheme=cell)


def test_fast_dev_run_dyt_stacked_on_a_scheme(tmp_path: Path, data_dir: Path):
    run("fit", tmp_path, data_dir, "--trainer.fast_dev_run=2", "-c", str(ROOT / "configs/norm/dyt.yaml"),
        scheme="reordered")  # fmt: skip


def test_moe_fast_dev_run_logs_aux_loss(tmp_path: Path, data_dir: Path):
    cli = SuiteCLI(
        args=["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/lm/moe-tiny.yaml"),
              f"--runs_root={tmp_path}", f"--trainer.default_root_dir={tmp_path}",
              f"--data.init_args.data_dir={data_dir}", "--trainer.fast_dev_run=2",
              "--trainer.enable_progress_bar=false", *TINY, "--model.init_args.trunk.moe_hidden=32"],
        save_config_callback=SaveConfigCallback,
    )  # fmt: skip
    aux = float(cli.trainer.callback_metrics["train/moe_aux"])
    assert 0.99 < aux < 1.5, aux  # E * sum_e f_e P_e, mean over the MoE blocks: about 1 for a fresh router


def _summary(runs: Path, name: str) -> dict:
    return json.loads((runs / "lm" / "tiny" / name / "summary.json").read_text())


@pytest.mark.slow
def test_fit_writes_run_dir_learns_and_tests_from_checkpoint(tmp_path: Path, data_dir: Path, capsys):
    steps = ["--trainer.max_steps=40", "--trainer.val_check_interval=20", "--model.init_args.optim.warmup_steps=5"]
    run("fit", tmp_path, data_dir, *steps, "--trainer.log_every_n_steps=5", "--summary.log_every_n_steps=5",
        scheme="siamese")  # fmt: skip
    run_dir = tmp_path / "lm" / "tiny" / "siamese"
    assert (run_dir / "config.yaml").is_file()
    assert list(run_dir.glob("events.out.tfevents.*"))
    summary = _summary(tmp_path, "siamese")
    assert summary["status"] == "finished" and summary["steps"] == 40 and summary["scheme"] == "siamese"
    first, last = summary["train_curve"][0][1], summary["train_curve"][-1][1]
    assert last < first - 0.5, summary["train_curve"]  # byte-level loss starts near ln(256) = 5.5
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    run("test", tmp_path, data_dir, f"--ckpt_path={ckpt}", scheme="siamese")
    test = _summary(tmp_path, "siamese")["test"]
    assert torch.isclose(torch.tensor(test["test/ppl"]), torch.tensor(test["test/loss"]).exp(), rtol=1e-4)
    capsys.readouterr()
    run("predict", tmp_path, data_dir, f"--ckpt_path={ckpt}", "--model.init_args.max_new_tokens=8",
        "--data.init_args.prompts=[In the beginning]", scheme="siamese")  # fmt: skip
    assert "[In the beginning]" in capsys.readouterr().out


@pytest.mark.slow
def test_same_seed_gives_same_losses(tmp_path: Path, corpus):
    """On the tests' small shared corpus: a fit's final validation reads its whole validation split (~40
    batches here, ~800 of the embedded corpus), which the training curves compared here do not depend on."""
    text, shards = corpus
    args = ["--trainer.max_steps=6", "--trainer.val_check_interval=3", "--summary.log_every_n_steps=1",
            f"--data.init_args.source={text}"]  # fmt: skip
    run("fit", tmp_path / "a", shards, *args)
    run("fit", tmp_path / "b", shards, *args)
    curve_a = json.loads((tmp_path / "a/lm/tiny/pre/summary.json").read_text())["train_curve"]
    curve_b = json.loads((tmp_path / "b/lm/tiny/pre/summary.json").read_text())["train_curve"]
    assert len(curve_a) >= 5 and curve_a == curve_b


def test_perplexity_is_exp_of_the_token_weighted_loss_and_stays_finite_where_a_softmax_underflows():
    """val/ppl from the loss equals torchmetrics' Perplexity (its own softmax) on ordinary logits, weighs batches by
    their tokens, and stays finite where a target's softmax probability underflows to 0 (torchmetrics: inf)."""
    import torch.nn.functional as F
    from torchmetrics.text import Perplexity

    from experiments.tasks.lm import PerplexityFromLoss

    torch.manual_seed(0)
    ours, reference = PerplexityFromLoss(), Perplexity()
    for tokens in (12, 4):  # unequal batches: an unweighted mean of the two losses would differ
        logits, targets = 3 * torch.randn(1, tokens, 50), torch.randint(0, 50, (1, tokens))
        ours.update(F.cross_entropy(logits.flatten(0, 1), targets.flatten()), weight=targets.numel())
        reference.update(logits, targets)
    assert float(ours.compute()) == pytest.approx(float(reference.compute()), rel=1e-5)
    logits = torch.zeros(1, 100, 8)
    logits[0, 0, 1] = 120.0  # token 0's target (class 0) has probability e^-120: 0 in a float32 softmax
    targets = torch.zeros(1, 100, dtype=torch.long)
    underflow = Perplexity()
    underflow.update(logits, targets)
    assert not torch.isfinite(underflow.compute())
    finite = PerplexityFromLoss()
    finite.update(F.cross_entropy(logits.flatten(0, 1), targets.flatten()), weight=100)
    mean_loss = (120.0 + 99 * math.log(8)) / 100  # token 0: 120 nats (up to e^-120); the rest uniform over 8
    assert float(finite.compute()) == pytest.approx(math.exp(mean_loss), rel=1e-5)
