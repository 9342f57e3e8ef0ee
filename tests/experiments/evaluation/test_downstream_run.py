"""Downstream evaluation inside real runs of the CLI on a tiny LM trained here: in-loop during ``fit`` (the
callback), at ``test`` (summary.json, TensorBoard, hparams), under 2-process DDP, and by the two tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import experiments.evaluation.downstream.harness  # noqa: F401 - registers the lm-eval model "suite-lm"
from experiments.__main__ import main
from tests.experiments.evaluation.conftest import yes_no_task
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[3]
WINDOW = 64
TINY = tiny_lm(seq_len=WINDOW)
TASKS = "[copa,openbook_qa]"
DOWNSTREAM = [
    "-c", str(ROOT / "configs/lm/downstream.yaml"), f"--model.init_args.downstream.tasks={TASKS}",
    "--model.init_args.downstream.limit=8", "--model.init_args.downstream.batch_size=4",
]  # fmt: skip


def cli(sub: str, runs: Path, *extra: str) -> list[str]:
    return [
        sub, "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={runs}",
        f"--data.init_args.data_dir={runs.parent / 'data'}", "--trainer.accelerator=cpu", *TINY, *extra,
    ]  # fmt: skip


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(path))
        events.Reload()
        for tag in events.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    return out


def hparams_metrics(run_dir: Path) -> list[list[str]]:
    """The metric columns each hparams 'experiment' summary of the run declares."""
    declared = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        events = EventAccumulator(str(path))
        events.Reload()
        if "_hparams_/experiment" in events.summary_metadata:
            data = plugin_data_pb2.HParamsPluginData.FromString(
                events.SummaryMetadata("_hparams_/experiment").plugin_data.content
            )
            declared.append([m.name.tag for m in data.experiment.metric_infos])
    return declared


@pytest.fixture(scope="session")
def run(tmp_path_factory) -> Path:
    """A tiny LM trained 4 steps with the in-loop callback every 2 steps, then tested with the overlay."""
    runs = tmp_path_factory.mktemp("downstream") / "runs"
    main(
        cli("fit", runs, "--trainer.max_steps=4", "--trainer.val_check_interval=4",
            "--trainer.callbacks+=experiments.evaluation.downstream.DownstreamEval",
            "--trainer.callbacks.every_n_steps=2", f"--trainer.callbacks.tasks={TASKS}", "--trainer.callbacks.limit=8")
    )  # fmt: skip
    run_dir = runs / "lm" / "tiny" / "pre"
    main(cli("test", runs, *DOWNSTREAM, f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"))
    return run_dir


def test_in_loop_callback_logs_downstream_curves(run: Path):
    tags = scalars(run)
    for tag in ("downstream/copa/acc", "downstream/openbook_qa/len_norm", "downstream/copa/bpb", "downstream/avg"):
        assert [step for step, _ in tags[tag]] == [2, 4], tag
    acc = [v for _, v in tags["downstream/copa/acc"]]
    assert all(0 <= v <= 1 and v * 8 == round(v * 8) for v in acc)  # a fraction of the 8 questions


def test_test_writes_scores_and_protocol_to_summary_tensorboard_and_hparams(run: Path):
    summary = json.loads((run / "summary.json").read_text())
    test = summary["test"]
    keys = {k for k in test if k.startswith("test/downstream/")}
    assert keys == {
        "test/downstream/copa/acc", "test/downstream/copa/ce_loss", "test/downstream/copa/bpb",
        "test/downstream/openbook_qa/len_norm", "test/downstream/openbook_qa/ce_loss",
        "test/downstream/openbook_qa/bpb", "test/downstream/avg", "test/downstream/avg_bpb",
    }  # fmt: skip
    avg = (test["test/downstream/copa/acc"] + test["test/downstream/openbook_qa/len_norm"]) / 2
    assert test["test/downstream/avg"] == pytest.approx(avg)
    assert "test/ppl" in test  # perplexity is still measured beside it
    protocol = summary["test_protocol"]["downstream"]
    assert protocol["limit"] == 8 and protocol["window"] == WINDOW
    assert protocol["tokenizer"] == {"kind": "byte", "vocab_size": 256}
    assert protocol["tasks"]["copa"]["docs"] == 8 and protocol["tasks"]["copa"]["metric"] == "acc"
    assert "left truncation" in protocol["truncation"]
    assert "test/downstream/avg" in scalars(run)
    assert any({"val/ppl", "test/downstream/avg", "test/downstream/avg_bpb"} <= set(m) for m in hparams_metrics(run))


def test_evaluate_tool_scores_the_checkpoint_as_test_did(run: Path, tmp_path: Path, capsys):
    ckpt = run / "checkpoints" / "last.ckpt"
    out = tmp_path / "scores.json"
    main(["evaluate", "--ckpt", str(ckpt), "--tasks", "copa,openbook_qa", "--limit", "8", "--out", str(out)])
    assert "| copa | acc |" in capsys.readouterr().out
    scores = json.loads(out.read_text())["scores"]
    test = json.loads((run / "summary.json").read_text())["test"]
    for name, value in scores.items():  # same weights, questions and batching: the same numbers
        assert test["test/" + name] == pytest.approx(value, rel=1e-6), name
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--ckpt", str(ckpt), "--tasks", "copa", "--out", str(out)])
    assert exc.value.code == 2 and "--overwrite" in capsys.readouterr().err


def test_lm_eval_model_loads_the_checkpoint_by_name(run: Path, tmp_path: Path):
    yes_no_task(tmp_path, "suite_local_yes")
    out = simple_evaluate(
        model="suite-lm",
        model_args={"ckpt": str(run / "checkpoints" / "last.ckpt")},
        tasks=["suite_local_yes"],
        batch_size=4,
        device="cpu",
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=False,
    )
    assert out["results"]["suite_local_yes"]["acc,none"] in (0.0, 1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0)
    assert out["config"]["model"] == "suite-lm"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "--ckpt", "nope.ckpt"], "checkpoint 'nope.ckpt' does not exist"),
        (["lm-eval", "--ckpt", "nope.ckpt", "--tasks", "x"], "checkpoint 'nope.ckpt' does not exist"),
    ],
)
def test_tools_refuse_bad_input_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and message in err


def test_unknown_task_is_a_one_line_error(run: Path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--tasks", "copa,nope_qa"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "unknown downstream task 'nope_qa'" in err


@pytest.mark.slow
@pytest.mark.xdist_group("processes")  # several busy processes: never beside another such test
def test_two_process_ddp_scores_equal_one_process(run: Path, tmp_path: Path):
    """Each rank scores every other row; ICLMetric gathers them: the same scores as the one-process test."""
    runs = run.parents[2]
    ddp = cli("test", runs, *DOWNSTREAM, f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "--run_name=ddp",
              "--trainer.devices=2", "--trainer.strategy=ddp")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", *ddp], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((run / "summary.json").read_text())
    two = json.loads((run.parent / "ddp" / "summary.json").read_text())
    assert two["test_protocol"]["downstream"]["world_size"] == 2
    names = [k for k in one["test"] if k.startswith("test/downstream/")]
    assert len(names) == 8
    for name in names:
        assert two["test"][name] == pytest.approx(one["test"][name], rel=1e-6, abs=1e-9), name


@pytest.mark.slow
def test_lm_eval_tool_passes_the_harness_options_through(run: Path, tmp_path: Path, capsys):
    """``python -m experiments lm-eval`` is ``lm-eval run --model suite-lm``: its options reach the harness
    (--include_path, --limit, --output_path), and it prints the harness's table. (Slow: the harness indexes
    its ~15k bundled task configs on every start.)"""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    yes_no_task(tasks, "suite_cli_yes")
    out = tmp_path / "results"
    main(["lm-eval", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--tasks", "suite_cli_yes",
          "--include_path", str(tasks), "--limit", "4", "--output_path", str(out), "--device", "cpu"])  # fmt: skip
    assert "suite_cli_yes" in capsys.readouterr().out
    (results,) = out.rglob("results_*.json")
    payload = json.loads(results.read_text())
    assert payload["results"]["suite_cli_yes"]["acc,none"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    assert payload["config"]["model"] == "suite-lm" and str(payload["config"]["batch_size"]) == "32"
    assert payload["n-samples"]["suite_cli_yes"]["effective"] == 4
