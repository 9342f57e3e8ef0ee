"""``bench`` checks where its report goes, its device and its numbers before it measures anything: a file in the
way of ``--out`` is one line and exit 2 at once (it used to measure for minutes and then end in FileExistsError),
through ``python -m experiments bench`` and ``python -m experiments.bench`` alike."""

from __future__ import annotations

import runpy
import sys

import pytest

import experiments.bench.cli as bench_cli
from tests.experiments.test_hostile_configs import error_line
from tests.experiments.test_hostile_resume import digest

SCALING = ["--scaling", "--widths", "32", "--depths", "1", "--width-depth", "1", "--depth-width", "32",
           "--scaling-batch", "2x16", "--steps", "1", "--warmup", "0"]  # fmt: skip


@pytest.fixture
def no_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measuring anything fails the test: every refusal here must come first."""

    def measured(*args, **kwargs):
        pytest.fail("bench measured before refusing")

    monkeypatch.setattr(bench_cli, "bench_scaling", measured)
    monkeypatch.setattr(bench_cli, "bench_tasks", measured)
    monkeypatch.setattr(bench_cli, "bench_training_steps", measured)


@pytest.mark.parametrize(
    ("args", "says"),
    [([*SCALING, "--out", "{file}"], "--out {file} is a file, not a directory; valid: a directory path"),
     (["--task", "lm", "--out", "{file}"], "--out {file} is a file, not a directory"),
     ([*SCALING, "--out", "{file}/sub"], "--out {file}/sub lies under {file}, which is a file"),
     (["--task", "lm", "--data-dir", "{file}", "--out", "{tmp}/out"], "--data-dir {file} is a file, not a directory"),
     (["--device", "nope"], "--device 'nope' is not a device torch knows (command line); valid: cpu"),
     (["--device", "cuda:7", "--out", "{tmp}/out"], "--device 'cuda:7': this machine has"),
     (["--steps", "nan", "--out", "{tmp}/out"], "--steps='nan' is not a finite number (command line)"),
     (["--seed", "99999999999999999999"], "--seed='99999999999999999999' must be >= 0 and <= 9223372036854775807"),
     (["--training-step", "--compile", "--out", "{tmp}/out"], "--training-step with --compile: --training-step times"),
     (["--training-step", "--steps", "0", "--out", "{tmp}/o"], "--steps='0' must be >= 1 and <= 10000 (command line)"),
     (["--training-step", "--out", "{file}"], "--out {file} is a file, not a directory")],
)  # fmt: skip
def test_a_bad_output_device_or_number_is_refused_before_measuring(args, says, tmp_path, capsys, no_measuring):
    file = tmp_path / "report"
    file.write_text("an earlier report, not a directory\n")
    before = digest(tmp_path)
    fill = {"file": str(file), "tmp": str(tmp_path)}
    line = error_line(["bench", *(a.format(**fill) for a in args)], capsys)
    if "cuda:7" in args and "no cuda device" not in line:
        assert "valid: cuda:0 to cuda:" in line, line  # a machine with fewer GPUs
    assert line.startswith("error: " + says.format(**fill)), line
    assert digest(tmp_path) == before  # nothing written, nothing measured


def test_python_m_experiments_bench_refuses_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys, no_measuring):
    """The module's own entry (what the Makefile runs), run as ``-m`` runs it: the same line, exit 2, no traceback."""
    file = tmp_path / "report"
    file.write_text("x\n")
    monkeypatch.setattr(sys, "argv", ["experiments.bench", *SCALING, "--out", str(file)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("experiments.bench", run_name="__main__")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: --out {file} is a file, not a directory; valid: a directory path\n"
    assert file.read_text() == "x\n"
