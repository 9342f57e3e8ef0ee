"""Issue #36, "a saved config sends output somewhere the user did not name": validate / test / predict of a run
copied to another place write into the copy (beside its checkpoint), never into ``./runs/<experiment>/<run>``
under the current directory that the copied ``config.yaml`` still names, nor into the original run."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from experiments.__main__ import main as suite_main
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
         "--trainer.num_sanity_val_steps=0", "--trainer.limit_test_batches=1",
         "--trainer.limit_predict_batches=1"]  # fmt: skip


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}  # fmt: skip


@pytest.fixture(scope="module")
def copied(tmp_path_factory, corpus) -> tuple[Path, Path]:
    """A tiny LM fitted under ``runs/`` (relative: its config.yaml says ``runs_root: runs``), then copied away."""
    text, shards = corpus
    home = tmp_path_factory.mktemp("made")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(home)
        suite_main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--data.init_args.source={text}",
                    f"--data.init_args.data_dir={shards}", *tiny_lm(depth=1, eval_samples=8), *STEPS,
                    "--experiment=made"])  # fmt: skip
    original = home / "runs" / "lm" / "made" / "pre"
    copy = tmp_path_factory.mktemp("elsewhere") / "copy"
    shutil.copytree(original, copy)
    return original, copy


@pytest.mark.parametrize("sub", ["validate", "test", "predict"])
@pytest.mark.parametrize("ckpt", ["named", "last"])
def test_evaluating_a_copied_run_writes_into_the_copy_only(sub, ckpt, copied, tmp_path, monkeypatch, capsys):
    original, copy = copied
    before = digest(original)
    monkeypatch.chdir(tmp_path)  # a user's working directory: nothing may appear here
    path = copy / "checkpoints" / "last.ckpt" if ckpt == "named" else "last"
    extra = ["--model.init_args.max_new_tokens=2", "--data.init_args.num_prompts=1"] if sub == "predict" else []
    suite_main([sub, "-c", str(copy / "config.yaml"), f"--ckpt_path={path}", *extra, "--overwrite"])
    assert f"saved to {copy}" in capsys.readouterr().out
    assert sorted(tmp_path.iterdir()) == []  # no ./runs/lm/made/pre
    assert digest(original) == before  # the original run is not touched either
    assert (copy / f"config.{sub}.yaml").is_file()


def test_a_place_the_user_names_still_wins(copied, tmp_path, monkeypatch, capsys):
    _, copy = copied
    monkeypatch.chdir(tmp_path)
    suite_main(["test", "-c", str(copy / "config.yaml"), f"--ckpt_path={copy / 'checkpoints' / 'last.ckpt'}",
                f"--runs_root={tmp_path / 'mine'}", "--run_name=evaluated"])  # fmt: skip
    assert (tmp_path / "mine" / "lm" / "made" / "evaluated" / "config.test.yaml").is_file()
