"""Issue #36, configs: what the command line gives wins over what a config or the data links in."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import SuiteCLI

ROOT = Path(__file__).resolve().parents[2]
TINY_DIT = ["-c", str(ROOT / "configs/dit/tiny.yaml"), "-c", str(ROOT / "configs/dit/synthetic-latents.yaml"),
            "--model.init_args.trunk.dim=32", "--model.init_args.trunk.depth=1", "--model.init_args.trunk.num_heads=2",
            "--trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.mark.parametrize("given", [None, "vae-dir"])
def test_vae_path_on_the_command_line_wins_over_the_datas(given, tmp_path):
    """Synthetic latents link vae_path=None into the DiT; a --model.init_args.vae_path the user gives (to decode
    predict's samples) must reach the model instead of being overridden by the data's."""
    extra = [f"--model.init_args.vae_path={tmp_path / given}"] if given else []
    cli = SuiteCLI(args=[*TINY_DIT, f"--runs_root={tmp_path / 'runs'}", *extra], run=False)
    assert cli.model.hparams.vae_path == (str(tmp_path / given) if given else None)


#################################################################################
#          Config files that would make the suite run code or stall            #
#################################################################################

from experiments.__main__ import main as suite_main  # noqa: E402


def error_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        suite_main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return line


def lm_args(tmp: Path, corpus, *extra: str) -> list[str]:
    text, shards = corpus
    return ["-c", str(ROOT / "configs/lm/tiny.yaml"), f"--data.init_args.source={text}",
            f"--data.init_args.data_dir={shards}", f"--runs_root={tmp / 'runs'}", *extra]  # fmt: skip


def hostile_configs(tmp: Path, marker: Path) -> dict[str, tuple[str, str]]:
    """name -> (YAML text, what the one line must say). Each would touch ``marker`` if it ran."""
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
    )
    return {
        "billion-laughs": (laughs, "anchors and aliases expand to more than 100,000 values"),
        "duplicate-key": ("trainer:\n  max_steps: 5\n  max_steps: 500000\n", "the key 'max_steps' appears twice"),
        "python-tag": (f"trainer:\n  max_steps: !!python/object/apply:os.system ['touch {marker}']\n",
                       "the tag '!!python/object/apply:os.system' asks for a Python object"),
        "custom-tag": ("trainer:\n  max_steps: !evil 3\n", "the tag '!evil' asks for a Python object"),
        "recursive": ("a: &a [*a]\n", "an alias refers to its own anchor"),
        "huge": ("trainer:\n  max_steps: 1\n" + "# padding\n" * 150_000, "bytes; valid: a YAML config of at most"),
        "model-popen": (f"model:\n  class_path: subprocess.Popen\n  init_args:\n    args: [touch, {marker}]\n",
                        "class_path 'subprocess.Popen' ({cfg}, model) is outside the suite and its libraries"),
        "data-os-system": (f"data:\n  class_path: os.system\n  init_args:\n    command: touch {marker}\n",
                           "class_path 'os.system' ({cfg}, data) is outside the suite"),
        "callback-eval": ("trainer:\n  callbacks:\n    - class_path: builtins.eval\n"
                          f"      init_args:\n        source: open('{marker}', 'w')\n",
                          "class_path 'builtins.eval' ({cfg}, trainer.callbacks[0]) is outside the suite"),
        "logger-shorthand": ("trainer:\n  logger: subprocess.Popen\n", "class_path 'subprocess.Popen'"),
        "strategy": ("trainer:\n  strategy:\n    class_path: evilmod.Strategy\n", "class_path 'evilmod.Strategy'"),
        "plugins": ("trainer:\n  plugins:\n    - evilmod.Plugin\n", "class_path 'evilmod.Plugin'"),
        "optimizer": ("optimizer:\n  class_path: evilmod.Optimizer\n", "class_path 'evilmod.Optimizer'"),
        "torch-function": ("model:\n  class_path: torch.load\n", "is function from torch.serialization, not a class"),
        "reexported": ("trainer:\n  callbacks:\n    - class_path: torch.multiprocessing.Process\n",
                       "not a class of the suite or its libraries"),
    }  # fmt: skip


@pytest.fixture
def evil_module(tmp_path, monkeypatch) -> Path:
    """``evilmod`` importable from sys.path: importing it (or building any of its classes) touches the marker."""
    marker = tmp_path / "ran"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "evilmod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nStrategy = Plugin = Optimizer = object\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    return marker


@pytest.mark.parametrize("case", sorted(hostile_configs(Path("/x"), Path("/m"))))
def test_a_hostile_config_is_one_line_before_anything_is_imported_or_built(case, tmp_path, corpus, evil_module, capsys):
    text, needle = hostile_configs(tmp_path, evil_module)[case]
    cfg = tmp_path / f"{case}.yaml"
    cfg.write_text(text)
    line = error_line(["fit", *lm_args(tmp_path, corpus, "-c", str(cfg))], capsys)
    assert needle.format(cfg=cfg) in line and (f"config {cfg}" in line or str(cfg) in line), line
    assert not evil_module.exists()  # nothing it names was imported, built or run
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "option",
    ["--model.class_path=subprocess.Popen", "--trainer.callbacks+=evilmod.Plugin", "--data=os.system",
     '--trainer.callbacks=[{"class_path": "builtins.exec", "init_args": {"source": "1"}}]',
     "--trainer.logger.class_path=evilmod.Strategy"],
)  # fmt: skip
def test_a_class_path_on_the_command_line_is_checked_the_same_way(option, tmp_path, corpus, evil_module, capsys):
    line = error_line(["fit", *lm_args(tmp_path, corpus, option)], capsys)
    assert "is outside the suite and its libraries" in line and "(command line, --" in line, line
    assert not evil_module.exists() and not (tmp_path / "runs").exists()


def test_a_runs_own_config_read_back_by_test_is_checked_too(tmp_path, corpus, evil_module, capsys):
    """``test -c RUN/config.yaml``: a saved config edited to name foreign code is refused like any file."""
    run = tmp_path / "runs" / "lm" / "tiny" / "pre"
    run.mkdir(parents=True)
    (run / ".suite-run").write_text('{"made_by": "fit"}')
    saved = (
        (ROOT / "configs/lm/tiny.yaml")
        .read_text()
        .replace("class_path: lightning.pytorch.callbacks.ModelCheckpoint", "class_path: evilmod.Plugin")
    )
    assert "evilmod.Plugin" in saved
    (run / "config.yaml").write_text(saved)
    before = (run / "config.yaml").read_bytes()
    line = error_line(["test", "-c", str(run / "config.yaml")], capsys)
    assert f"class_path 'evilmod.Plugin' ({run / 'config.yaml'}, trainer.callbacks[0])" in line
    assert not evil_module.exists() and (run / "config.yaml").read_bytes() == before


def test_a_truncated_config_names_the_file_and_where_it_ends(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    whole = (ROOT / "configs/lm/tiny.yaml").read_text()
    cut = whole[: whole.index("model:")]  # what a full disk or a kill mid-write leaves
    (run / "config.yaml").write_text(cut)
    line = error_line(["test", "-c", str(run / "config.yaml")], capsys)
    assert f"config {run / 'config.yaml'} (and any other -c) sets no" in line and "is it cut short?" in line, line
    assert "model:" in line and "data:" in line and "it ends at line" in line
