"""Sweep files as careless and hostile users write them: every mistake one line naming the file and the key,
exit status 2, nothing created or deleted outside the sweep's own directories."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from experiments.__main__ import main as suite_main
from experiments.monitoring.summary import RUN_MARKER
from experiments.reliability.errors import SuiteError
from experiments.sweeps import sweep
from experiments.sweeps.ownership import SWEEP_MARKER, claim_sweep_dir, prepare_run_dir, remove_run_dir
from experiments.sweeps.spec import grid, load_specs, parse_assignments

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/lm/tiny.yaml")


def write_spec(tmp_path: Path, **keys) -> Path:
    spec = {"name": "s", "configs": [TINY], "schemes": ["pre"], "runs_root": str(tmp_path / "runs"), **keys}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def one_line_error(path: Path, *extra: str, capsys) -> str:
    """Runs ``python -m experiments sweep`` in-process; returns its one-line error (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        suite_main(["sweep", str(path), *extra])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2, err
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_numbers_written_as_strings_are_converted(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = tmp_path / "s.yaml"  # PyYAML reads 1e-3 (no dot) as the string "1e-3"
    path.write_text(f"name: s\nconfigs: [{TINY}]\nschemes: [pre]\nlrs: [1e-3, 2.0e-3]\nwarmups: ['100']\nseeds: 1\n")
    (spec,) = load_specs(str(path))
    assert spec.lrs == [0.001, 0.002] and spec.warmups == [100] and spec.seeds == [1]
    assert [r.lr for r in grid(spec)] == [0.001, 0.002]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"lrs": ["abc"]}, r"lrs\[0\]='abc' is not a number \(.*spec\.yaml\)"),
        ({"lrs": [-1e-3]}, r"lrs\[0\]=-0\.001 must be > 0"),
        ({"warmups": [1.5]}, r"warmups\[0\]=1\.5 is not a whole number"),
        ({"parallel": "two"}, r"parallel='two' is not a number"),
        ({"schemes": []}, r"schemes is empty .* the grid has no run"),
        ({"schemes": ["bogus"]}, r"unknown scheme 'bogus' .*; valid: pre, post"),
        ({"lrs": [0.001, 0.0010000001]}, r"two grid points map to the run name 'pre-lr0\.001'"),
        ({"name": "../../x"}, r"name='\.\./\.\./x' .*valid: one path component"),
        ({"name": "a/b"}, r"name='a/b'"),
        ({"name": ".hidden"}, r"name='\.hidden'"),
        ({"budget": {"tokens": 1e9, "steps": 10}}, r"budget gives \['steps', 'tokens'\]"),
        ({"launcher": {"kind": "cloud"}}, r"launcher\.kind='cloud' .*valid: process, submitit"),
        ({"launcher": {"kind": "submitit", "nodes": 0}}, r"launcher\.nodes=0 must be >= 1"),
        ({"colour": "red"}, r"unknown sweep keys \['colour'\]"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(tmp_path: Path, monkeypatch, capsys, keys: dict, message: str):
    monkeypatch.chdir(ROOT)
    err = one_line_error(write_spec(tmp_path, **keys), capsys=capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_a_hostile_overlay_name_cannot_make_a_run_name_with_a_path(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    evil = tmp_path / "a b;rm.yaml"
    evil.write_text("trainer: {max_steps: 1}\n")
    other = tmp_path / "ok.yaml"
    other.write_text("trainer: {max_steps: 2}\n")
    err = one_line_error(write_spec(tmp_path, overlays=[str(evil), str(other)]), capsys=capsys)
    assert "run name='pre-a b;rm'" in err


@pytest.mark.parametrize("text", ["", "name: [unclosed\n", "- just\n- a list\n"])
def test_empty_or_broken_yaml_names_the_file(tmp_path: Path, capsys, text: str):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    err = one_line_error(path, capsys=capsys)
    assert str(path) in err


def test_bad_command_line_options_exit_2(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    path = write_spec(tmp_path)
    assert "--launcher 'nodes'; valid: KEY=VALUE" in one_line_error(path, "--launcher", "nodes", capsys=capsys)
    assert "--parallel=0" in one_line_error(path, "--parallel", "0", capsys=capsys)
    assert "budget.steps='many'" in one_line_error(path, "--budget", "steps=many", capsys=capsys)
    with pytest.raises(SystemExit) as exc:
        suite_main(["sweep", str(path), "--no-such-flag"])
    assert exc.value.code == 2
    assert parse_assignments(["extra.constraint=h100", "nodes=2"], "launcher") == {
        "extra": {"constraint": "h100"},
        "nodes": 2,
    }


def test_a_sweep_dir_whose_marker_another_sweep_is_writing_is_adopted(tmp_path: Path):
    """Two sweeps on one spec: the second may look while the first has only the marker's temp file there."""
    from fileio.atomic import temp_path

    sweep_dir = tmp_path / "runs" / "lm" / "s"
    sweep_dir.mkdir(parents=True)
    other = temp_path(sweep_dir / SWEEP_MARKER)
    other.write_text("{}")  # the other sweep, between writing and renaming
    claim_sweep_dir(sweep_dir, "s", "spec.yaml")
    assert (sweep_dir / SWEEP_MARKER).is_file()
    (sweep_dir / SWEEP_MARKER).unlink()
    other.unlink()
    (sweep_dir / f"{SWEEP_MARKER}.tmp").write_text("not a temp name the suite makes")
    with pytest.raises(SuiteError, match="was not made by a sweep"):
        claim_sweep_dir(sweep_dir, "s", "spec.yaml")


def test_a_foreign_directory_is_never_adopted_or_deleted(tmp_path: Path):
    sweep_dir = tmp_path / "runs" / "lm" / "s"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "thesis.tex").write_text("years of work")
    with pytest.raises(SuiteError, match="was not made by a sweep"):
        claim_sweep_dir(sweep_dir, "s", "spec.yaml")
    (sweep_dir / "thesis.tex").unlink()
    claim_sweep_dir(sweep_dir, "s", "spec.yaml")
    foreign = sweep_dir / "pre"
    foreign.mkdir()
    (foreign / "data.txt").write_text("keep me")
    with pytest.raises(SuiteError, match="not a suite run directory"):
        prepare_run_dir(sweep_dir, "pre")
    with pytest.raises(SuiteError, match="refusing to delete"):
        remove_run_dir(sweep_dir, "pre")
    assert (foreign / "data.txt").read_text() == "keep me"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / RUN_MARKER).write_text("{}")  # marked, but not inside the sweep directory
    (sweep_dir / "post").symlink_to(outside, target_is_directory=True)
    with pytest.raises(SuiteError, match="refusing to delete"):
        remove_run_dir(sweep_dir, "post")
    assert outside.is_dir() and (outside / RUN_MARKER).exists()
    made = prepare_run_dir(sweep_dir, "siamese")
    assert (made / RUN_MARKER).exists()
    remove_run_dir(sweep_dir, "siamese")  # the suite's own run: deleted
    assert not made.exists()


def test_restart_refuses_to_delete_a_run_directory_the_suite_did_not_make(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    path = write_spec(tmp_path)
    run_dir = tmp_path / "runs/lm/s/pre"
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    err = one_line_error(path, "--restart", capsys=capsys)
    assert "was not made by a sweep" in err or "not a suite run directory" in err
    assert (run_dir / "notes.txt").read_text() == "mine"


def test_status_of_a_sweep_that_never_ran_is_one_line(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    err = one_line_error(write_spec(tmp_path), "--status", capsys=capsys)
    assert "holds no sweep yet" in err


@pytest.mark.slow
def test_a_sweep_whose_every_run_crashed_exits_non_zero(tmp_path: Path, monkeypatch, capsys):
    """A real run that fails at once (3 heads do not divide width 32): the sweep says so and exits 1. The run's
    command runs in this process (its exit status as a process's; test_sweep.py runs real child processes)."""
    from tests.experiments.in_process import call_in_process

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sweep.Children, "call", call_in_process)
    path = write_spec(tmp_path, args=["--model.init_args.trunk.dim=32", "--model.init_args.trunk.num_heads=3"])
    with pytest.raises(SystemExit) as exc:
        suite_main(["sweep", str(path)])
    captured = capsys.readouterr()
    assert exc.value.code == 1, captured.err
    assert "[1/1] pre: CRASHED (exit 2)" in captured.out
    assert "error: 1 run(s) crashed: pre" in captured.err
    assert sweep.previous_status(tmp_path / "runs/lm/s/pre/summary.json") == "crashed"


def test_collect_compares_what_finished_and_status_shows_the_rest(tmp_path: Path, monkeypatch, capsys):
    """Mid-sweep on a cluster: one run finished, one still running (fresh progress), one never started."""
    import json
    import time

    from tests.experiments.test_compare import summary

    monkeypatch.chdir(ROOT)
    path = write_spec(tmp_path, lrs=[1e-3, 2e-3, 3e-3])
    sweep_dir = tmp_path / "runs/lm/s"
    claim_sweep_dir(sweep_dir, "s", str(path))
    for name, status in (("pre-lr0.001", "finished"), ("pre-lr0.002", "running")):
        run = prepare_run_dir(sweep_dir, name)
        (run / "summary.json").write_text(json.dumps(summary("pre", 1e-3, status, 1.5)))
    progress = {"stage": "fit", "status": "running", "step": 50, "total": 300, "loss": 2.0, "steps_per_s": 5.0,
                "eta_s": 50.0, "updated": time.time()}  # fmt: skip
    (sweep_dir / "pre-lr0.002" / "progress.json").write_text(json.dumps(progress))
    sweep.main(["sweep", str(path), "--collect"])
    table = (sweep_dir / "comparison.md").read_text()
    assert "| pre-lr0.001 |" in table and "pre-lr0.002" not in table and "pre-lr0.003" not in table
    capsys.readouterr()
    sweep.main(["sweep", str(path), "--status"])
    out = capsys.readouterr().out
    assert re.search(r"pre-lr0\.001\s+finished\s+-\s+step 300, val/loss 1\.5", out), out
    assert re.search(r"pre-lr0\.002\s+running\s+-\s+step 50/300 \(17%\), loss 2, 5 steps/s, eta 00:\d\d", out), out
    assert re.search(r"pre-lr0\.003\s+not started", out) and "1 finished, 1 running, 1 not started" in out, out
