"""The export's model card (``README.md``): what was trained, how, and every test number with its protocol.

    ---                                  YAML front matter, the Hub's metadata: library_name, tags (the
    library_name / pipeline_tag / tags   scheme, the suite's tag that marks an export), the dataset by name
    datasets                             (KJV Bible, Fashion-MNIST), and ``model-index``:
    model-index: [results: ...]          one result per test metric, its protocol under ``args``
    ---
    # name
    Norm scheme (its equations, from the scheme's own docstring), Sizes, Data, Training, Results (the
    same numbers as a table, protocol in words), How to load, Checks, Files

Numbers come only from the run: ``summary.json`` (``test``, ``test_protocol``, ``final_val``) and the
checkpoint's hyperparameters; a run that was never tested says so instead of showing a table.
The front matter is written by huggingface_hub's ``ModelCardData`` (the Hub's own format).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from experiments.sharing.checkpoint import RunCheckpoint
from experiments.sharing.output import CARD_FILE, SUITE_TAG, human_size
from experiments.sharing.report import ExportReport
from models.schemes import get_scheme

TASKS = {
    "lm": ("text-generation", "Causal language modeling"),
    "vit": ("image-classification", "Image classification"),
    "dit": ("unconditional-image-generation", "Class-conditional latent image generation"),
}
METRIC_TYPES = {"ppl": "perplexity", "loss": "loss", "acc1": "accuracy", "acc5": "top_5_accuracy", "fid": "fid"}
DATA_KEYS = ("dataset", "source", "root", "cache_dir", "data_dir")  # the field that names a DataModule's data


def model_name(run: RunCheckpoint) -> str:
    """``<experiment>-<run name>`` of a run directory (``tiny-siamese``), else the checkpoint's stem."""
    if run.run_dir is not None:
        return f"{run.run_dir.parent.name}-{run.run_dir.name}"
    return run.path.stem


def scheme_text(scheme: str) -> str:
    """The scheme's equations as its class documents them (and its module's, when the class points there)."""
    cls = get_scheme(scheme)
    text = inspect.getdoc(cls) or scheme
    if "module docstring" in text:
        module = inspect.getmodule(cls)
        text += "\n\n" + (inspect.getdoc(module) or "")
    return text


# The suite's data sources by the names their loaders give them, as a reader knows them.
DATASET_NAMES = {
    "bible-kjv": "KJV Bible",
    "pydoc-topics": "Python documentation topics (pydoc)",
    "fashion-mnist": "Fashion-MNIST",
    "sklearn-digits": "scikit-learn digits (8x8)",
    "synthetic": "synthetic latents",
}


def data_source_name(run: RunCheckpoint) -> str | None:
    """The name the run's data loader gives its data ("bible-kjv", "fashion-mnist", a file's stem), read from
    what the run left (the shards' or latent cache's meta.json) or from what an embedded source resolves to;
    None when it cannot be told without the data."""
    hp = run.data_hparams
    kind = str(hp.get("_class_path", "")).rsplit(".", 1)[-1]
    try:
        if kind == "TextDataModule":
            from datamodules.text.corpus import embedded_corpus_name

            source = str(hp.get("source", "embedded"))
            return embedded_corpus_name() if source == "embedded" else Path(source).stem or None
        if kind == "EmbeddedImageDataModule":
            from datamodules.images.embedded import embedded_image_info

            return embedded_image_info()[0]
        if kind == "SyntheticLatentDataModule":
            return "synthetic"
        for key in ("cache_dir", "root", "data_dir"):
            if hp.get(key):
                meta = Path(str(hp[key])) / "meta.json"
                if meta.is_file():
                    found = json.loads(meta.read_text(encoding="utf-8")).get("source_name")
                    if isinstance(found, str):
                        return Path(found).stem if "/" in found else found
                return Path(str(hp[key])).name or None
    except (OSError, ValueError):
        return None
    return None


def dataset(run: RunCheckpoint) -> tuple[str, str]:
    """(name, type) of the run's data for ``model-index``: the dataset as a reader knows it ("KJV Bible",
    "Fashion-MNIST"), and its loader's name for it as the type; the DataModule class when it cannot be told."""
    hp = run.data_hparams
    kind = str(hp.get("_class_path", "unknown")).rsplit(".", 1)[-1]
    source = data_source_name(run)
    if source is not None:
        return DATASET_NAMES.get(source, source), source
    named = next((f"{k}={hp[k]}" for k in DATA_KEYS if hp.get(k) not in (None, "")), "")
    return (f"{kind}({named})" if named else kind), kind


def trainer_settings(run: RunCheckpoint) -> dict[str, Any]:
    trainer = run.config.get("trainer") or {}
    keep = ("max_steps", "max_epochs", "precision", "devices", "num_nodes", "accumulate_grad_batches",
            "gradient_clip_val", "limit_test_batches")  # fmt: skip
    settings = {k: trainer[k] for k in keep if trainer.get(k) not in (None, -1)}
    if "seed_everything" in run.config:
        settings["seed"] = run.config["seed_everything"]
    return settings


def metric_protocol(run: RunCheckpoint, metric: str) -> dict[str, Any]:
    """How ``metric`` was measured: the run's recorded test protocol where it has one, else its test settings."""
    recorded = run.summary.get("test_protocol") or {}
    short = metric.removeprefix("test/")
    if short.startswith("downstream/") and "downstream" in recorded:
        downstream = dict(recorded["downstream"])
        tasks = downstream.pop("tasks", {})
        task = short.split("/")[1]
        return {**downstream, **({"task": tasks[task]} if task in tasks else {})}
    if run.task == "dit" and short != "loss" and recorded:
        return {k: v for k, v in recorded.items() if k != "downstream"}
    hp, data = run.hparams, run.data_hparams
    protocol: dict[str, Any] = {"split": "test", "weights": "EMA" if run.uses_ema else "trained", "step": run.step}
    if "batch_size" in data:
        protocol["batch_size"] = data["batch_size"]
    if "limit_test_batches" in trainer_settings(run):
        protocol["limit_test_batches"] = trainer_settings(run)["limit_test_batches"]
    if run.task == "lm":
        protocol |= {"window": hp["seq_len"], "tokenizer": data.get("tokenizer", "see data")}
    elif run.task == "vit":
        protocol |= {"image_size": hp["img_size"], "transform": "the run's eval transform (pretrained_cfg)"}
    else:
        protocol |= {"objective": "epsilon MSE (+ VLB with learned sigma) at timesteps and noise seeded per batch"}
    return protocol


def eval_results(run: RunCheckpoint, name: str) -> list[EvalResult]:
    task_type, task_name = TASKS[run.task]
    data_name, data_type = dataset(run)
    results = []
    for metric, value in sorted((run.summary.get("test") or {}).items()):
        short = metric.removeprefix("test/")
        results.append(
            EvalResult(
                task_type=task_type,
                task_name=task_name,
                dataset_type=data_type,
                dataset_name=data_name,
                dataset_split="test",
                metric_type=METRIC_TYPES.get(short, short),
                metric_value=float(value),
                metric_name=metric,
                metric_args=json.loads(json.dumps(metric_protocol(run, metric), default=str)),
            )
        )
    return results


def task_sizes(run: RunCheckpoint) -> list[tuple[str, Any]]:
    """The task network's own sizes, beside the trunk's."""
    hp = run.hparams
    if run.task == "lm":
        return [("vocabulary", hp["vocab_size"]), ("window", hp["seq_len"]), ("tied embeddings", hp["tie_embeddings"])]
    if run.task == "vit":
        return [("image size / patch", f"{hp['img_size']} / {hp['patch_size']}"), ("classes", hp["num_classes"])]
    latents = f"{hp['latent_channels']}x{hp['latent_size']}x{hp['latent_size']}"
    return [
        ("latents", latents),
        ("patch", hp["patch_size"]),
        ("classes", hp["num_classes"]),
        ("learned sigma", hp["learn_sigma"]),
    ]


def heads(trunk: dict[str, Any]) -> str:
    """``8``, or ``8 (2 key/value heads)`` under grouped-query attention."""
    kv = trunk.get("num_kv_heads")
    return f"{trunk['num_heads']}" + (f" ({kv} key/value heads)" if kv and kv != trunk["num_heads"] else "")


def _table(rows: list[tuple[str, Any]]) -> str:
    lines = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


def _protocol_words(protocol: dict[str, Any]) -> str:
    return "; ".join(
        f"{k}: {json.dumps(v, default=str) if isinstance(v, dict | list) else v}" for k, v in protocol.items()
    )


def body(run: RunCheckpoint, report: ExportReport, name: str, files: list[tuple[str, int]]) -> str:
    """The card's Markdown after the front matter."""
    trunk, hp = run.hparams["trunk"], run.hparams
    _, task_name = TASKS[run.task]
    sizes = [
        ("parameters", f"{report.params:,}"),
        ("width / depth / heads", f"{trunk['dim']} / {trunk['depth']} / {heads(trunk)}"),
        ("MLP", f"{trunk['mlp']} (hidden {trunk.get('mlp_hidden') or 4 * trunk['dim']})"),
        ("norm layer", f"{trunk['norm_layer']} (eps {trunk['norm_eps']:g})"),
        ("QK-norm", trunk["qk_norm"]),
    ]
    if trunk.get("moe_experts"):
        sizes.append(("mixture of experts", f"{trunk['moe_experts']} experts, top-{trunk['moe_top_k']}"))
    sizes += task_sizes(run)
    data = [("dataset", dataset(run)[0])] + [(k, v) for k, v in run.data_hparams.items() if not k.startswith("_")]
    optim = [(f"optim.{k}", v) for k, v in (hp.get("optim") or {}).items()]
    training = [("steps trained", run.step), *trainer_settings(run).items(), *optim]
    if run.uses_ema:
        training.append(("exported weights", f"EMA (decay {hp.get('ema_decay')})"))
    metrics = sorted((run.summary.get("test") or {}).items())
    if metrics:
        rows = [f"| {m} | {v:.6g} | {_protocol_words(metric_protocol(run, m))} |" for m, v in metrics]
        results = "\n".join(["| metric | value | protocol |", "|---|---|---|", *rows])
    else:
        results = (
            "No test metrics: the run was not tested. `python -m experiments test -c RUN/config.yaml "
            "--ckpt_path RUN/checkpoints/last.ckpt` records them; export again afterwards."
        )
    final_val = run.summary.get("final_val") or {}
    if final_val:
        results += "\n\nLast validation: " + ", ".join(f"{k} {v:.6g}" for k, v in sorted(final_val.items()))
    whole = run.summary.get("whole_split_val") or {}
    if whole:
        results += "\n\nFinal weights on the whole validation split: " + ", ".join(
            f"{k} {v:.6g}" for k, v in sorted(whole.items())
        )
    checks = "\n".join(f"- {line}" for line in report.checks) or "- not run (`--no-check`)"
    notes = "".join(f"\n- {note}" for note in report.notes)
    listing = "\n".join(f"| `{path}` | {human_size(size)} |" for path, size in files)
    return f"""# {name}

{task_name} trained with the SiameseNorm suite under the **`{run.scheme}`** norm scheme, exported for
{report.library} (`{report.model_class}`).

## Norm scheme: `{run.scheme}`

```
{scheme_text(run.scheme)}
```

## Sizes

{_table(sizes)}

## Data

{_table(data)}

## Training

{_table(training)}

## Results

{results}

## How to load

```python
{report.usage.replace("DIR", "path/to/this/folder")}
```
{notes}

## Checks at export

Reloaded in a fresh interpreter without the suite, with the library's own calls:

{checks}

## Files

| file | size |
|---|---|
{listing}
"""


def write_card(run: RunCheckpoint, report: ExportReport, folder: Path) -> Path:
    """Writes ``folder/README.md`` (after every other file, which it lists)."""
    name = model_name(run)
    files = sorted((p.relative_to(folder).as_posix(), p.stat().st_size) for p in folder.rglob("*") if p.is_file())
    tags = [SUITE_TAG, f"norm-scheme-{run.scheme}", run.task]
    data = ModelCardData(
        library_name=report.library,
        pipeline_tag=TASKS[run.task][0],
        tags=tags,
        datasets=[dataset(run)[0]],
        model_name=name,
        eval_results=eval_results(run, name) or None,
    )
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body(run, report, name, files)}")
    path = folder / CARD_FILE
    card.save(path)
    return path
