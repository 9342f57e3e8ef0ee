"""An LM checkpoint of the suite as a plain model plus its tokenizer, for the tools outside a Lightning run.

Everything comes from the checkpoint file, read with ``torch.load(weights_only=True)`` (tensors and
plain data only): the LM task's saved hyperparameters (trunk, vocabulary, context length) rebuild a
:class:`models.LanguageModel`, its ``net.*`` weights load into it, and the DataModule's saved
hyperparameters name the tokenizer: byte-level, or the BPE ``tokenizer.json`` beside the run's prepared
shards (``data_dir`` is resolved from the current directory, as in training). ``--tokenizer DIR`` points
at another directory holding ``tokenizer.json`` / ``byte_tokenizer.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamodules.text.tokenizers import TextTokenizer, load_tokenizer
from experiments.reliability.checkpointing import step_of
from experiments.reliability.errors import CheckpointError, SuiteError
from experiments.reliability.safe_load import load_checkpoint
from models import LanguageModel, TrunkConfig

LM_CLASS = "LanguageModeling"
DATA_CLASS = "datamodules.text.TextDataModule"


@dataclass
class LoadedLM:
    """A checkpoint's language model (eval mode, on CPU) and what it was trained with."""

    net: LanguageModel
    tokenizer: TextTokenizer
    step: int
    scheme: str
    path: Path

    @property
    def window(self) -> int:
        return self.net.max_seq_len


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_lm_checkpoint(ckpt: str | Path, mmap: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint's payload and its LM hyperparameters, checked to describe an LM of the suite.

    ``mmap=True`` maps the tensors instead of reading them: a cheap check of a large file before slow work.

    Raises:
        CheckpointError: missing, not a checkpoint dict (or a complete sharded one), or not an LM checkpoint.
    """
    path = Path(ckpt)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist; valid: a .ckpt file of an LM run")
    # weights_only; not a checkpoint dict: refused in one line; a sharded checkpoint (a folder): consolidated once
    payload = load_checkpoint(path, mmap=mmap)
    hparams = payload.get("hyper_parameters") or {}
    task = str(hparams.get("_class_path", "?")) if isinstance(hparams, dict) else "?"
    if task.rsplit(".", 1)[-1] != LM_CLASS or not isinstance(hparams.get("trunk"), dict):
        raise CheckpointError(
            f"checkpoint {path} holds a {task!r} model; valid: a checkpoint of experiments.tasks.{LM_CLASS}"
        )
    if not isinstance(payload.get("state_dict"), dict):
        raise CheckpointError(f"checkpoint {path} has no state_dict of tensors; valid: a checkpoint written by fit")
    return payload, hparams


def load_lm(ckpt: str | Path, tokenizer_dir: str | Path | None = None) -> LoadedLM:
    """Rebuilds the LM of a suite checkpoint and finds its tokenizer.

    Raises:
        SuiteError / CheckpointError: one line, when the file is missing, unreadable, not an LM checkpoint,
            or its tokenizer cannot be found.
    """
    path = Path(ckpt)
    payload, hparams = read_lm_checkpoint(path)
    try:
        trunk = TrunkConfig(**hparams["trunk"])
        vocab_size, seq_len = int(hparams["vocab_size"]), int(hparams["seq_len"])
        net = LanguageModel(trunk, vocab_size, max_seq_len=seq_len, tie_embeddings=bool(hparams["tie_embeddings"]))
    except (KeyError, TypeError, ValueError) as err:  # hyperparameters edited or from another version
        raise CheckpointError(
            f"checkpoint {path}: its saved hyperparameters do not build an LM ({type(err).__name__}: "
            f"{_first_line(err)}); valid: a checkpoint written by fit"
        ) from None
    weights = payload["state_dict"]
    state = {k.removeprefix("net."): v for k, v in weights.items() if isinstance(k, str) and k.startswith("net.")}
    try:
        net.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:  # a non-tensor where a weight belongs
        raise CheckpointError(f"checkpoint {path} does not fit its own hyperparameters: {_first_line(err)}") from None
    tokenizer = run_tokenizer(payload.get("datamodule_hyper_parameters") or {}, path, tokenizer_dir)
    if tokenizer.vocab_size > net.vocab_size:
        raise SuiteError(
            f"tokenizer has {tokenizer.vocab_size} tokens but {path} was trained with vocab_size={net.vocab_size}; "
            "valid: the tokenizer the run was trained with"
        )
    step = step_of(payload, path) if "global_step" in payload else 0  # an exported weights file has no step
    return LoadedLM(net.eval(), tokenizer, step, trunk.norm_scheme, path)


def run_tokenizer(
    data_hparams: dict[str, Any], ckpt: str | Path, tokenizer_dir: str | Path | None = None
) -> TextTokenizer:
    """The tokenizer a run was trained with: from ``tokenizer_dir`` when given, else found from the run's
    DataModule hyperparameters (``data_hparams``, as saved in ``ckpt``).

    Raises:
        SuiteError: one line, when it cannot be found.
    """
    if tokenizer_dir is not None:
        return _load_tokenizer_dir(tokenizer_dir)
    return _run_tokenizer(data_hparams, Path(ckpt))


def _load_tokenizer_dir(directory: str | Path) -> TextTokenizer:
    try:
        return load_tokenizer(directory)
    except FileNotFoundError as err:
        valid = "a directory holding tokenizer.json or byte_tokenizer.json"
        raise SuiteError(f"{_first_line(err)}; valid: {valid}") from None


def _run_tokenizer(data_hparams: dict[str, Any], ckpt: Path) -> TextTokenizer:
    """The tokenizer the run's TextDataModule used (bytes need no file; BPE is read beside the shards)."""
    from datamodules.text.datamodule import TextDataModule

    found = data_hparams.get("_class_path") if isinstance(data_hparams, dict) else type(data_hparams).__name__
    if found != DATA_CLASS:
        raise SuiteError(f"checkpoint {ckpt} records no {DATA_CLASS} (got {found!r}); valid: pass --tokenizer DIR")
    kwargs = {k: v for k, v in data_hparams.items() if isinstance(k, str) and not k.startswith("_")}
    try:
        datamodule = TextDataModule(**kwargs)
    except (TypeError, ValueError) as err:  # hyperparameters edited or from another version
        raise SuiteError(
            f"checkpoint {ckpt}: its saved data hyperparameters do not build a TextDataModule ({_first_line(err)}); "
            "valid: pass --tokenizer DIR"
        ) from None
    try:
        return datamodule.tokenizer
    except (RuntimeError, FileNotFoundError, ValueError) as err:
        raise SuiteError(
            f"the run's {kwargs.get('tokenizer')} tokenizer is not in {datamodule.shard_dir} ({_first_line(err)}); "
            "valid: run from the directory the run was trained in, or pass --tokenizer DIR"
        ) from None
