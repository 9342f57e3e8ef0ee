"""Where a run writes, what it may replace, and what a newcomer sees: through the real CLI on a tiny LM.

- each subcommand keeps its own saved config, and each reruns with the subcommand that saved it;
- a fit-saved config pins no logger, so ``--run_name`` works; a rerun never replaces its run unasked;
- validate / test / predict of a checkpoint write into that checkpoint's run, never another run's folder;
- ``--trainer.default_root_dir`` holds the whole run; hostile names never leave the root;
- ``--help``, ``--print_config``, "run saved to ...", no Lightning advert, no ``v_num`` in the bar;
- TensorBoard's HPARAMS tab: the scheme first, the key and test metrics as columns.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import LIGHTNING_COMMANDS, TOOLS, usage
from experiments.__main__ import main as suite_main
from experiments.reliability.layout import RUN_MARKER
from experiments.tasks import LanguageModeling
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
         "--trainer.num_sanity_val_steps=0"]  # fmt: skip


def lm(sub: str, corpus, *extra: str, configs: tuple[str, ...] = ("configs/lm/tiny.yaml",)) -> list[str]:
    text, shards = corpus
    given = [a for cfg in configs for a in ("-c", str(ROOT / cfg))]
    data = [f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}"]
    return [sub, *given, *data, *tiny_lm(depth=1, eval_samples=8), *extra]


def error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        suite_main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-2000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return line


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def demo(tmp_path_factory, corpus) -> Path:
    """A siamese run fitted as the demo names it (``runs/lm/demo/siamese``), then validated, tested, predicted."""
    runs = tmp_path_factory.mktemp("runs")
    suite_main(lm("fit", corpus, f"--runs_root={runs}", "--experiment=demo", *STEPS,
                  configs=("configs/lm/tiny.yaml", "configs/norm/siamese.yaml")))  # fmt: skip
    run = runs / "lm" / "demo" / "siamese"
    ckpt = f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"
    # What a user copies from the quickstart: the tiny configs, pointed at the demo's checkpoint.
    for sub, extra in [("validate", []), ("test", []), ("predict", ["--model.init_args.max_new_tokens=4"])]:
        suite_main(lm(sub, corpus, f"--runs_root={runs}", ckpt, *extra,
                      configs=("configs/lm/tiny.yaml", "configs/norm/siamese.yaml")))  # fmt: skip
    return run


def test_each_subcommand_keeps_its_own_config(demo: Path):
    names = sorted(p.name for p in demo.glob("config*.yaml"))
    assert names == ["config.predict.yaml", "config.test.yaml", "config.validate.yaml", "config.yaml"]
    fit = yaml.safe_load((demo / "config.yaml").read_text())
    assert fit["trainer"]["logger"] is None and fit["trainer"]["default_root_dir"] is None  # nothing pinned
    assert fit["experiment"] == "demo" and fit["run_name"] is None and "verbose" not in fit
    assert fit["trainer"]["max_steps"] == 2
    assert yaml.safe_load((demo / "config.test.yaml").read_text())["verbose"] is True
    assert (demo / RUN_MARKER).is_file()


def test_evaluating_the_demo_checkpoint_writes_into_the_demo_run_only(demo: Path):
    runs = demo.parents[2]
    assert sorted(p.name for p in (runs / "lm").iterdir()) == ["demo"]  # no runs/lm/tiny/siamese appeared
    summary = json.loads((demo / "summary.json").read_text())
    assert summary["status"] == "finished" and "test/ppl" in summary["test"]


@pytest.mark.parametrize("sub", ["validate", "test", "predict"])
def test_a_saved_evaluation_config_reruns_with_its_subcommand(sub: str, demo: Path, capsys):
    before = (demo / "config.yaml").read_bytes()
    suite_main([sub, "-c", str(demo / f"config.{sub}.yaml")])
    out = capsys.readouterr().out
    assert f"saved to {demo}" in out
    assert (demo / "config.yaml").read_bytes() == before  # fit's config is never replaced by another subcommand


@pytest.mark.parametrize("sub", ["test", "predict"])
def test_the_quickstart_evaluates_a_run_from_its_own_config(sub: str, demo: Path, capsys, caplog):
    """README: ``python -m experiments test -c runs/lm/demo/siamese/config.yaml --ckpt_path last``."""
    with caplog.at_level(logging.INFO):
        suite_main([sub, "-c", str(demo / "config.yaml"), "--ckpt_path=last", "--model.init_args.max_new_tokens=2"])
    assert f"--ckpt_path last: {sub} uses {demo / 'checkpoints'}" in caplog.text  # which checkpoint it took
    assert f"saved to {demo}" in capsys.readouterr().out


def test_a_saved_fit_config_reruns_under_a_new_name_and_never_over_its_run(demo: Path, capsys):
    before = files(demo / "checkpoints")
    line = error_line(["fit", "-c", str(demo / "config.yaml")], capsys)
    assert f"run directory {demo} already holds a run" in line and "--run_name NEW" in line
    assert files(demo / "checkpoints") == before
    suite_main(["fit", "-c", str(demo / "config.yaml"), "--run_name=again", "--trainer.max_steps=1"])
    again = demo.parent / "again"
    assert (again / "checkpoints" / "last.ckpt").is_file() and (again / "config.yaml").is_file()
    assert files(demo / "checkpoints") == before


@pytest.mark.slow
def test_overwrite_replaces_a_suite_run_and_nothing_else(tmp_path: Path, corpus, capsys):
    runs = tmp_path / "runs"
    args = lm("fit", corpus, f"--runs_root={runs}", *STEPS)
    suite_main(args)
    run = runs / "lm" / "tiny" / "pre"
    (run / "checkpoints" / "stale.ckpt").write_bytes((run / "checkpoints" / "last.ckpt").read_bytes())
    suite_main([*args, "--overwrite"])
    assert not (run / "checkpoints" / "stale.ckpt").exists() and (run / "checkpoints" / "last.ckpt").is_file()
    assert yaml.safe_load((run / "config.yaml").read_text())["overwrite"] is False  # a rerun must ask again
    # A directory the suite did not make is never deleted, --overwrite or not.
    foreign = runs / "lm" / "tiny" / "mine"
    (foreign / "checkpoints").mkdir(parents=True)
    (foreign / "checkpoints" / "precious.ckpt").write_text("not the suite's")
    line = error_line([*args, "--run_name=mine", "--overwrite"], capsys)
    assert f"{foreign} was not made by the suite" in line
    assert (foreign / "checkpoints" / "precious.ckpt").read_text() == "not the suite's"


@pytest.mark.parametrize("option", ["--run_name", "--experiment"])
@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs", "..", ".", "", " x", "x\ny"])
def test_a_name_that_is_not_one_path_component_is_refused(option: str, name: str, tmp_path: Path, corpus, capsys):
    line = error_line(lm("fit", corpus, f"--runs_root={tmp_path / 'runs'}", f"{option}={name}"), capsys)
    assert f"{option}={name!r} is not a valid name" in line and "one directory level" in line
    assert not any(tmp_path.rglob("*"))  # nothing created, inside the root or outside it


def test_default_root_dir_holds_the_whole_run(tmp_path: Path, corpus, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --runs_root ("runs") would be relative to here
    root = tmp_path / "lightning-root"
    suite_main(lm("fit", corpus, f"--trainer.default_root_dir={root}", *STEPS))
    run = root / "lm" / "tiny" / "pre"
    for name in ("checkpoints/last.ckpt", "config.yaml", "summary.json", "hparams.yaml", RUN_MARKER):
        assert (run / name).is_file(), name
    assert list(run.glob("events.out.tfevents.*"))
    assert not (tmp_path / "runs").exists()  # runs_root is not used when default_root_dir is given


def test_help_print_config_and_the_command_list(tmp_path: Path, corpus, capsys):
    with pytest.raises(SystemExit) as exit_info:
        suite_main(["fit", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m experiments [options] fit")
    assert all(f"  {name} " in usage() for name in [*LIGHTNING_COMMANDS, *TOOLS])
    with pytest.raises(SystemExit):
        suite_main(lm("fit", corpus, f"--runs_root={tmp_path / 'runs'}", *STEPS, "--print_config"))
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    assert not (tmp_path / "runs").exists()  # printing a config runs nothing
    suite_main(["fit", "-c", str(printed), "--trainer.max_steps=1"])  # the printed config runs as it is
    assert (tmp_path / "runs" / "lm" / "printed" / "pre" / "checkpoints" / "last.ckpt").is_file()  # named after it


@pytest.mark.slow
def test_a_plain_fit_says_where_its_run_went_and_nothing_else(tmp_path: Path, corpus):
    """The real command line, progress bar on: the run's place is printed, Lightning's advert and noise are not."""
    runs = tmp_path / "runs"
    args = [a for a in lm("fit", corpus, f"--runs_root={runs}", *STEPS) if a != "--trainer.enable_progress_bar=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert f"run saved to {runs / 'lm' / 'tiny' / 'pre'} (tensorboard --logdir {runs / 'lm' / 'tiny'})" in output
    for noise in ("litlogger", "LitLogger", "LeafSpec", "deprecated", "v_num"):
        assert noise not in output, noise


def test_hparams_tab_shows_the_scheme_first_and_the_metrics_as_columns(demo: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(demo), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    names = [h.name for h in experiment.hparam_infos]
    assert names[0] == "norm_scheme" and names == sorted(names) and len(names) <= 8  # TensorBoard sorts by name
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics[:3] == ["val/ppl", "test/ppl", "test/loss"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["norm_scheme"].string_value == "siamese"
    # Declaring a metric column writes no placeholder (NaN) into its chart: every point of val/ppl was measured.
    points = [(e.step, e.value) for e in events.Scalars("val/ppl")]
    assert points and all(math.isfinite(v) for _, v in points), points
    # validate and test of the 2-step checkpoint log where its training ended (step 1, like fit's own last
    # validation), not at step 0 before every curve
    # (other tests of this module re-run test on the same run: every one of its points sits at step 1)
    assert {e.step for e in events.Scalars("test/ppl")} == {points[-1][0]} == {1}
    assert sorted({step for step, _ in points}) == [1]  # fit's validation and validate's, both at the checkpoint


def hparam_names(run: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    content = events.PluginTagToContent("hparams")["_hparams_/experiment"]
    return [h.name for h in plugin_data_pb2.HParamsPluginData.FromString(content).experiment.hparam_infos]


@pytest.mark.slow
def test_hparams_columns_shows_only_the_named_columns_and_refuses_unknown_ones(tmp_path: Path, corpus, capsys):
    """What a sweep passes: the axes its grid varies; the scheme stays first, a typo is one line."""
    runs = f"--runs_root={tmp_path / 'runs'}"
    suite_main(lm("fit", corpus, runs, *STEPS, "--hparams_columns=[seed,optim/lr]"))
    assert hparam_names(tmp_path / "runs" / "lm" / "tiny" / "pre") == ["norm_scheme", "optim/lr", "seed"]
    line = error_line(lm("fit", corpus, runs, *STEPS, "--run_name=typo", "--hparams_columns=[sead]"), capsys)
    assert "'sead' is not an HPARAMS column" in line and "valid: norm_scheme, optim/lr" in line


class SamplingLM(LanguageModeling):
    """The LM task plus a file per prompt under ``<run>/samples``: a task whose predict writes files."""

    def output_paths(self, stage: str, run_dir: Path) -> list[Path]:
        return [run_dir / "samples"] if stage == "predict" else []

    def predict_step(self, batch, batch_idx: int) -> list[str]:
        texts = super().predict_step(batch, batch_idx)
        out = Path(self.trainer.log_dir) / "samples"
        out.mkdir(exist_ok=True)
        (out / f"{batch_idx}.txt").write_text("\n".join(texts))
        return texts


@pytest.mark.slow
def test_predict_files_are_not_replaced_without_overwrite(tmp_path: Path, corpus, capsys):
    overlay = tmp_path / "sampling.yaml"
    overlay.write_text("model:\n  class_path: tests.experiments.test_run_layout.SamplingLM\n")
    args = lm("predict", corpus, f"--runs_root={tmp_path / 'runs'}", "-c", str(overlay),
              "--model.init_args.max_new_tokens=2", "--data.init_args.num_prompts=1")  # fmt: skip
    suite_main(args)
    samples = tmp_path / "runs" / "lm" / "tiny" / "pre" / "samples"
    (samples / "stale.txt").write_text("from an earlier predict")
    line = error_line(args, capsys)
    assert f"predict would overwrite {samples}" in line and "--overwrite" in line
    assert (samples / "stale.txt").exists()
    suite_main([*args, "--overwrite"])
    assert sorted(p.name for p in samples.iterdir()) == ["0.txt"]  # replaced as asked, nothing stale left
