"""``python -m experiments prune`` and ``logit-lens`` on a tiny checkpoint trained here (a few steps)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from experiments.analysis import cli as analysis_cli
from experiments.analysis.loading import load_module, validation_batches
from experiments.analysis.logit_lens import logit_lens_table
from experiments.cli import main as cli_main
from experiments.tasks.lm import LanguageModeling
from experiments.tasks.optim import OptimConfig
from models import TrunkConfig
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
DEPTH = 3
TINY = tiny_lm(depth=DEPTH)  # eval_samples 16 = two validation batches: --batches 2 is the whole set


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A siamese LM trained 4 steps (lr high enough that the streams move apart), validated at the end."""
    tmp = tmp_path_factory.mktemp("analysis")
    cli_main(
        ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), "-c", str(ROOT / "configs/norm/siamese.yaml"),
         f"--runs_root={tmp}", f"--data.init_args.data_dir={tmp / 'data'}",
         "--trainer.max_steps=4", "--trainer.val_check_interval=4", "--model.init_args.optim.warmup_steps=0",
         "--model.init_args.optim.lr=1e-2", *TINY]
    )  # fmt: skip
    return tmp / "lm" / "tiny" / "siamese"


def read_csv(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def rmsnorm(x, weight, eps: float = 1e-5):
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight


def test_prune_table_one_row_per_block_and_baseline_is_the_runs_val_loss(run_dir: Path, tmp_path: Path, capsys):
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    analysis_cli.main(["prune", "--ckpt", str(ckpt), "--batches", "2", "--out", str(tmp_path), "--device", "cpu"])
    printed = capsys.readouterr().out
    rows = read_csv(tmp_path / "pruning.csv")
    assert [r["skipped"] for r in rows] == ["none"] + [f"block_{b}" for b in range(DEPTH)]
    assert "| block_2 |" in printed and (tmp_path / "pruning.md").read_text() in printed
    assert (tmp_path / "pruning.png").stat().st_size > 1000
    # The baseline is exactly the validation loss Lightning logged for this checkpoint (same 2 batches).
    logged = json.loads((run_dir / "summary.json").read_text())["final_val"]["val/loss"]
    base = float(rows[0]["loss"])
    assert base == pytest.approx(logged, rel=1e-5)
    for r in rows[1:]:
        assert float(r["increase"]) == pytest.approx(float(r["loss"]) - base, abs=1e-6)
        assert float(r["relative"]) == pytest.approx((float(r["loss"]) - base) / base, rel=1e-5)
        assert abs(float(r["increase"])) > 1e-5  # skipping a block changes the loss
    # One skipped row by hand: block 1 left out of the trunk loop, same validation batches.
    module, datamodule = load_module(ckpt, [], [], "cpu")
    batches = validation_batches(datamodule, 2, "cpu")
    net, total, count = module.net, 0.0, 0
    with torch.no_grad():
        for batch in batches:
            x, y = batch[:, :-1], batch[:, 1:]
            state = net.trunk.init_state(net.embed(x))
            for b in (0, 2):
                state, _ = net.trunk.blocks[b](state, rope=(net.rope_cos, net.rope_sin), is_causal=True)
            logits = net.head(net.trunk.readout(state))
            total += float(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
            count += y.numel()
    assert float(rows[2]["loss"]) == pytest.approx(total / count, rel=1e-5)


def test_logit_lens_siamese_two_streams_against_hand_readouts(run_dir: Path, capsys):
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    analysis_cli.main(["logit-lens", "--ckpt", str(ckpt), "--batches", "2", "--device", "cpu"])  # --out: the run dir
    assert "| post |" in capsys.readouterr().out
    rows = {r["stream"]: r for r in read_csv(run_dir / "logit_lens.csv")}
    assert list(rows) == ["post", "pre", "full"]
    for r in rows.values():
        for key in ("agreement", "agreement_where_streams_disagree", "streams_disagree", "accuracy"):
            assert 0.0 <= float(r[key]) <= 1.0
    assert float(rows["full"]["agreement"]) == 1.0
    logged = json.loads((run_dir / "summary.json").read_text())["final_val"]["val/loss"]
    assert float(rows["full"]["loss"]) == pytest.approx(logged, rel=1e-5)  # the batches Lightning validated on
    # Each stream's readout by hand: N_o(N_a(x)) and N_o(N_b(y)) (RMSNorm), then the LM head.
    module, datamodule = load_module(ckpt, [], [], "cpu")
    net, readout = module.net, module.net.trunk.readout
    agree = {"post": 0, "pre": 0}
    disagree = positions = correct_pre = 0
    with torch.no_grad():
        for batch in validation_batches(datamodule, 2, "cpu"):
            x, y = batch[:, :-1], batch[:, 1:]
            state, _ = net.trunk.forward_state(net.embed(x), rope=(net.rope_cos, net.rope_sin), is_causal=True)
            full = net(x).argmax(-1)
            post = net.head(rmsnorm(rmsnorm(state.post, readout.norm_a.weight), readout.norm_o.weight)).argmax(-1)
            pre = net.head(rmsnorm(rmsnorm(state.pre, readout.norm_b.weight), readout.norm_o.weight)).argmax(-1)
            agree["post"] += int((post == full).sum())
            agree["pre"] += int((pre == full).sum())
            disagree += int((post != pre).sum())
            correct_pre += int((pre == y).sum())
            positions += y.numel()
    for name in ("post", "pre"):
        assert float(rows[name]["agreement"]) == pytest.approx(agree[name] / positions, abs=1e-6)
    assert float(rows["pre"]["streams_disagree"]) == pytest.approx(disagree / positions, abs=1e-6)
    assert float(rows["pre"]["accuracy"]) == pytest.approx(correct_pre / positions, abs=1e-6)
    assert disagree > 0  # the two streams do read out differently, so the restricted column is defined
    post_d, pre_d = (float(rows[n]["agreement_where_streams_disagree"]) for n in ("post", "pre"))
    assert post_d + pre_d <= 1.0 + 1e-6  # where they disagree, at most one of them matches the model


def test_logit_lens_single_stream_agrees_with_itself():
    module = LanguageModeling(
        TrunkConfig(dim=16, depth=2, num_heads=2, mlp="swiglu", mlp_hidden=32, norm_scheme="pre"),
        OptimConfig(),
        vocab_size=50,
        seq_len=16,
    ).eval()
    batch = torch.randint(0, 50, (4, 17))
    (row_x, row_full) = logit_lens_table(module, [batch])
    assert row_x["stream"] == "x" and row_x["agreement"] == 1.0 and row_x["streams_disagree"] == 0.0
    assert math.isnan(row_x["agreement_where_streams_disagree"])
    with torch.no_grad():
        logits = module.net(batch[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    assert row_x["loss"] == pytest.approx(float(expected), rel=1e-5) == row_full["loss"]


def _one_line_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        analysis_cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_missing_checkpoint_is_a_one_line_error(tmp_path: Path, capsys):
    err = _one_line_error(["prune", "--ckpt", str(tmp_path / "nope.ckpt")], capsys)
    assert err.startswith("error: checkpoint") and "does not exist" in err


def test_logit_lens_refuses_a_vit_checkpoint(tmp_path: Path, capsys):
    ckpt = tmp_path / "vit.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    argv = ["logit-lens", "--ckpt", str(ckpt), "--config", str(ROOT / "configs/vit/tiny.yaml")]
    err = _one_line_error(argv + ["--model.init_args.trunk.depth=1", "--model.init_args.trunk.dim=16"], capsys)
    assert "'vit' checkpoint" in err and "takes lm" in err


def test_outputs_are_not_replaced_unasked_and_out_under_a_file_is_one_line(run_dir: Path, tmp_path: Path, capsys):
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    out = tmp_path / "prune"
    analysis_cli.main(["prune", "--ckpt", ckpt, "--batches", "1", "--out", str(out), "--device", "cpu"])
    before = (out / "pruning.csv").read_text()
    capsys.readouterr()
    err = _one_line_error(["prune", "--ckpt", ckpt, "--batches", "1", "--out", str(out)], capsys)
    assert f"would overwrite {out / 'pruning.md'}" in err and "--overwrite" in err
    assert (out / "pruning.csv").read_text() == before
    analysis_cli.main(["prune", "--ckpt", ckpt, "--batches", "2", "--out", str(out), "--overwrite", "--device", "cpu"])
    assert (out / "pruning.csv").read_text() != before  # two batches now: replaced as asked
    (tmp_path / "a-file").write_text("")
    err = _one_line_error(["logit-lens", "--ckpt", ckpt, "--out", str(tmp_path / "a-file" / "sub")], capsys)
    assert f"{tmp_path / 'a-file'} is a file" in err


def test_prune_and_logit_lens_explain_themselves_differently(capsys):
    texts = []
    for tool in ("prune", "logit-lens"):
        with pytest.raises(SystemExit):
            analysis_cli.main([tool, "--help"])
        texts.append(capsys.readouterr().out)
    assert texts[0] != texts[1] and "pruning.md" in texts[0] and "logit_lens.md" in texts[1]
    assert texts[0].startswith("usage: python -m experiments prune")
    assert texts[1].startswith("usage: python -m experiments logit-lens")
