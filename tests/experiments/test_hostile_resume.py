"""Issue #36, resume with a changed config: ``fit --ckpt_path last`` with another learning rate, width, scheme or
data is refused naming the keys (nothing written); with ``--resume_with_changes`` it resumes and config.yaml
records the changes, the config it resumed from kept beside it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]


def fit_args(runs: Path, corpus, *extra: str) -> list[str]:
    text, shards = corpus
    return ["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={runs}", f"--data.init_args.source={text}",
            f"--data.init_args.data_dir={shards}", *tiny_lm(depth=1, eval_samples=8), "--trainer.limit_val_batches=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.val_check_interval=2", *extra]  # fmt: skip


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, corpus) -> Path:
    runs = tmp_path_factory.mktemp("stopped")
    main(fit_args(runs, corpus, "--trainer.max_steps=2"))
    return runs


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("--model.init_args.optim.lr=0.05", "model.init_args.optim.lr: 0.002 -> 0.05"),
        ("--model.init_args.trunk.norm_scheme=siamese", "model.init_args.trunk.norm_scheme: 'pre' -> 'siamese'"),
        ("--data.init_args.batch_size=4", "data.init_args.batch_size: 8 -> 4"),
        ("--seed_everything=7", "seed_everything: 1234 -> 7"),
    ],
)
def test_resuming_with_other_settings_is_refused_naming_them(change, named, stopped, tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(stopped, runs)
    before = digest(runs)
    extra = [change, "--run_name=pre"] if "norm_scheme" in change else [change]
    with pytest.raises(SystemExit) as exit_info:
        main(fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last", *extra))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "with other settings than its config.yaml" in line and "--resume_with_changes" in line, line
    assert named.split(":")[0] in line, line
    assert digest(runs) == before  # nothing written: config.yaml and hparams still say what ran


def test_a_longer_budget_resumes_silently_and_changes_resume_on_request(stopped, tmp_path, corpus, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(stopped, runs)
    run = runs / "lm" / "tiny" / "pre"
    main(fit_args(runs, corpus, "--trainer.max_steps=3", "--ckpt_path=last"))  # the trainer's budget may change
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["changed_on_resume"] is None and not list(run.glob("config.before-resume-*.yaml"))
    old = (run / "config.yaml").read_bytes()
    main(fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last", "--model.init_args.optim.lr=0.05",
                  "--resume_with_changes"))  # fmt: skip
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["init_args"]["optim"]["lr"] == 0.05
    assert saved["changed_on_resume"] == ["model.init_args.optim.lr: 0.002 -> 0.05"]
    assert saved["resume_with_changes"] is False  # a rerun of config.yaml asks again
    assert (run / "config.before-resume-1.yaml").read_bytes() == old


def test_tensorboard_hparams_of_a_resume_with_changes_name_the_changes(stopped, tmp_path, corpus):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    runs = tmp_path / "runs"
    shutil.copytree(stopped, runs)
    run = runs / "lm" / "tiny" / "pre"
    before = {p.name for p in run.glob("events.out.tfevents.*")}
    main(fit_args(runs, corpus, "--trainer.max_steps=4", "--ckpt_path=last", "--model.init_args.optim.lr=0.05",
                  "--resume_with_changes"))  # fmt: skip
    (resumed,) = [p for p in run.glob("events.out.tfevents.*") if p.name not in before]
    events = EventAccumulator(str(resumed), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    row = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert row["changed_on_resume"].string_value == "model.init_args.optim.lr: 0.002 -> 0.05"
    assert row["norm_scheme"].string_value == "pre"
